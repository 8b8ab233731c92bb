"""What the pages' forms share: the services decide the rules, and their errors land next to
the fields they name; text that no field may hold is refused once, here, for every form."""

from django.core.exceptions import ValidationError

from gpucap import inputs


class ServiceErrorsMixin:
    """For a ``forms.Form``: ``add_service_errors`` puts a service's ``ValidationError`` next to
    the fields it names (a key for another field is mapped through ``error_fields``); what names
    no field of the form is shown above it.

    Every field's typed text is checked first (``gpucap.inputs``): a control character or lone
    surrogate anywhere, or a bidi control in a name, is an error on that field and never
    reaches a service or the database."""

    # Service error keys that belong to another field of the form.
    error_fields: dict[str, str] = {}

    def _clean_fields(self) -> None:
        super()._clean_fields()
        for name, bound in self._bound_items():
            values = bound.data if isinstance(bound.data, (list, tuple)) else [bound.data]
            for value in values:
                if not isinstance(value, str):
                    continue
                reason = inputs.text_problem(value, name=inputs.is_name_field(name))
                if reason is not None:
                    self._errors.pop(name, None)  # this reason first: the others may be its echo
                    self.add_error(name, reason)
                    break

    def add_service_errors(self, error: ValidationError) -> None:
        if not hasattr(error, "error_dict"):
            self.add_error(None, error)
            return
        for name, errors in error.error_dict.items():
            name = self.error_fields.get(name, name)
            self.add_error(name if name in self.fields else None, errors)

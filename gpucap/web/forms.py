"""What the pages' forms share: the services decide the rules, and their errors land next to
the fields they name."""

from django.core.exceptions import ValidationError


class ServiceErrorsMixin:
    """For a ``forms.Form``: ``add_service_errors`` puts a service's ``ValidationError`` next to
    the fields it names (a key for another field is mapped through ``error_fields``); what names
    no field of the form is shown above it."""

    # Service error keys that belong to another field of the form.
    error_fields: dict[str, str] = {}

    def add_service_errors(self, error: ValidationError) -> None:
        if not hasattr(error, "error_dict"):
            self.add_error(None, error)
            return
        for name, errors in error.error_dict.items():
            name = self.error_fields.get(name, name)
            self.add_error(name if name in self.fields else None, errors)

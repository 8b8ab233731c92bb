"""The operator's audit log page: newest first, filtered by verb and object type."""

from django import forms
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from gpucap.audit import selectors
from gpucap.web.pages import operator_required, render_page


class AuditFilterForm(forms.Form):
    verb = forms.ChoiceField(required=False)
    object_type = forms.ChoiceField(required=False, label="Object type")

    def __init__(self, data, *, options: selectors.AuditFilterOptions) -> None:
        super().__init__(data)
        self.fields["verb"].choices = [("", "All verbs"), *[(v, v) for v in options.verbs]]
        self.fields["object_type"].choices = [
            ("", "All objects"),
            *[(t, t) for t in options.object_types],
        ]

    def filters(self) -> dict[str, str]:
        self.is_valid()
        return {name: value for name, value in self.cleaned_data.items() if value}


@require_GET
@operator_required
def audit_log(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET, options=selectors.audit_filter_options())
    filters = form.filters()
    page = selectors.audit_page(**filters, page=request.GET.get("page", 1))
    query = request.GET.copy()
    query.pop("page", None)
    context = {"nav": "audit", "form": form, "page": page, "query": query.urlencode()}
    return render_page(request, "audit/log.html", context, fragment="audit-table")

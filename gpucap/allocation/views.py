"""The operators' quotas page: every tenant's quotas with their use, a form to set one (or
change the one a tenant has in that scope) and a button to remove each. A form refused
re-renders in place (400) with the reasons next to the fields; nothing changes."""

from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from gpucap.allocation import selectors, services
from gpucap.allocation.forms import QuotaForm
from gpucap.allocation.models import TenantQuota
from gpucap.web.pages import operator_required, render_page


@require_GET
@operator_required
def quota_list(request: HttpRequest) -> HttpResponse:
    return _page(request, form=QuotaForm())


@require_POST
@operator_required
def quota_set(request: HttpRequest) -> HttpResponse:
    form = QuotaForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            saved = services.quota_set(
                tenant=data["tenant"],
                pool=data["pool"],
                gpu_model=data["gpu_model"],
                max_gpus=data["max_gpus"],
                max_pending=data["max_pending"],
                actor=request.user,
            )
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            verb = "Set" if saved.created else "Changed"
            done = f"{verb} {saved.quota}: {saved.quota.max_gpus} GPUs."
            if not request.htmx:
                return redirect("allocation:quotas")
            return _page(request, form=QuotaForm(), done=done, note=saved.note)
    return _page(request, form=form, status=400)


@require_POST
@operator_required
def quota_delete(request: HttpRequest, pk: int) -> HttpResponse:
    quota = get_object_or_404(TenantQuota.objects.select_related("tenant", "pool"), pk=pk)
    words = str(quota)
    services.quota_delete(quota=quota, actor=request.user)
    if not request.htmx:
        return redirect("allocation:quotas")
    return _page(request, form=QuotaForm(), done=f"Removed {words}.")


def _page(request: HttpRequest, *, form: QuotaForm, status: int = 200, **extra) -> HttpResponse:
    context = {
        "nav": "quotas",
        "quotas": [
            {"quota": quota, "use": use, "note": services.below_use_note(quota, use)}
            for quota, use in selectors.quotas_with_use()
        ],
        "form": form,
        **extra,
    }
    return render_page(
        request, "allocation/quotas.html", context, fragment="quotas-panel", status=status
    )

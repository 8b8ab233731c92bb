"""VM pages: a tenant's VMs with the request form, every VM for operators, and one VM's detail
with stop / start / terminate.

A tenant's pages carry its slug (``/tenants/acme/vms/``), so a member of several tenants always
knows which one a new VM is for. A VM's own page (``/vms/42/``) is shared by its tenant's
members and operators; anyone else gets a 404. Views adapt the request and call selectors or
services; the lifecycle's rules live in ``gpucap.rentals.services``, a notice's in
``gpucap.notices``. The pages show both, so they live above rentals and notices.
"""

from collections.abc import Callable

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpucap.errors import Conflict
from gpucap.notices import drains
from gpucap.notices.models import InterruptionNotice
from gpucap.notices.services import notice_seconds_for
from gpucap.plans.waiting import vm_waiting
from gpucap.rentals import jobs, selectors, services
from gpucap.rentals.models import VirtualMachine
from gpucap.roles import is_operator, tenant_change_allowed, tenant_change_check
from gpucap.tenancy import selectors as tenancy
from gpucap.vms import selectors as vm_lists
from gpucap.vms.forms import VmFilterForm, VmRequestForm
from gpucap.web.pages import operator_required, render_page, tenant_pick

# An HTMX event the request form sends so the VM table refreshes at once.
VMS_CHANGED = "vms-changed"


@require_GET
@login_required
def vm_list(request: HttpRequest) -> HttpResponse:
    """Operators: every VM, filtered. A tenant member: their tenant's VMs (a member of several
    picks the tenant first)."""
    if not is_operator(request.user):
        return tenant_pick(
            request,
            tenancy.tenants_for(request.user),
            url_name="rentals:tenant-vms",
            nav="vms",
            title="VMs",
            things="VMs",
            things_long="VMs and pools",
        )
    form = VmFilterForm(request.GET, options=vm_lists.vm_filter_options())
    filters = form.filters()
    page = vm_lists.vm_page(**filters, page=request.GET.get("page", 1))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "nav": "vms",
        "form": form,
        "filtered": bool(filters),
        "page": page,
        "query": query.urlencode(),
        "polling_fast": any(vm.state in selectors.TRANSITIONAL for vm in page.object_list),
    }
    return render_page(request, "vms/vm_list.html", context, fragment="vm-table")


@require_http_methods(["GET", "POST"])
@login_required
def tenant_vms(request: HttpRequest, slug: str) -> HttpResponse:
    """A tenant's VMs and the form to request one. Operators look in read-only."""
    tenant = tenancy.tenant_visible_to(user=request.user, slug=slug)
    include_terminated = request.GET.get("terminated") == "1"
    job = request.GET.get("job", "")[:60]
    if request.method == "POST":
        tenant_change_check(request.user, tenant.pk)
        return _vm_request(request, tenant, include_terminated=include_terminated)
    form = VmRequestForm(tenant=tenant) if tenant_change_allowed(request.user, tenant.pk) else None
    context = _tenant_context(request, tenant, form, include_terminated=include_terminated, job=job)
    return render_page(request, "vms/tenant_vms.html", context, fragment="vm-table")


def _vm_request(request: HttpRequest, tenant, *, include_terminated: bool) -> HttpResponse:
    form = VmRequestForm(request.POST, tenant=tenant)
    if form.is_valid():
        try:
            vms = jobs.rental_request(tenant=tenant, actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            if not request.htmx:
                return redirect("rentals:tenant-vms", slug=tenant.slug)
            context = _tenant_context(
                request, tenant, VmRequestForm(tenant=tenant), include_terminated=False
            )
            context["requested"], context["requested_count"] = vms[0], len(vms)
            response = render_page(request, "vms/tenant_vms.html", context, fragment="vm-request")
            response["HX-Trigger"] = VMS_CHANGED
            return response
    context = _tenant_context(request, tenant, form, include_terminated=include_terminated)
    return render_page(request, "vms/tenant_vms.html", context, fragment="vm-request", status=400)


def _tenant_context(request, tenant, form, *, include_terminated: bool, job: str = "") -> dict:
    listing = vm_lists.tenant_vms(tenant=tenant, include_terminated=include_terminated, job=job)
    return {"nav": "vms", "tenant": tenant, "listing": listing, "form": form}


# --- one VM -----------------------------------------------------------------------------------


@require_GET
@login_required
def vm_detail(request: HttpRequest, pk: int) -> HttpResponse:
    vm = selectors.vm_visible_to(user=request.user, pk=pk)
    return render_page(request, "vms/vm_detail.html", _vm_context(request, vm), fragment="vm-live")


@require_POST
@login_required
def vm_stop(request: HttpRequest, pk: int) -> HttpResponse:
    return _vm_act(request, pk, services.vm_stop, tenant_side=True)


@require_POST
@login_required
def vm_start(request: HttpRequest, pk: int) -> HttpResponse:
    return _vm_act(request, pk, services.vm_start, tenant_side=True)


@require_POST
@login_required
def vm_terminate(request: HttpRequest, pk: int) -> HttpResponse:
    """Terminate the VM, or with ``whole_job=1`` every VM of its multi-VM job."""
    whole_job = request.POST.get("whole_job") == "1"
    act = jobs.job_terminate if whole_job else services.vm_terminate
    return _vm_act(request, pk, act, tenant_side=True)


@require_POST
@operator_required
def vm_reclaim(request: HttpRequest, pk: int) -> HttpResponse:
    """An operator takes a rental back: a ``reclaim`` notice, then a stop at its deadline."""
    return _vm_act(request, pk, drains.vm_reclaim, tenant_side=False)


def _vm_act(
    request: HttpRequest, pk: int, act: Callable[..., object], *, tenant_side: bool
) -> HttpResponse:
    """Call the service; answer with the refreshed VM, or the reason nothing changed. A
    tenant-side action is its members' alone (operators look in read-only)."""
    vm = selectors.vm_visible_to(user=request.user, pk=pk)
    if tenant_side:
        tenant_change_check(request.user, vm.tenant_id)
    error, status = "", 200
    try:
        act(vm=vm, actor=request.user)
    except Conflict as exc:
        error, status = exc.message, 409
    except ValidationError as exc:
        error, status = "; ".join(exc.messages), 400
    if status == 200 and not request.htmx:
        return redirect("rentals:vm-detail", pk=pk)
    vm = selectors.vm_visible_to(user=request.user, pk=pk)
    context = {**_vm_context(request, vm), "error": error}
    return render_page(request, "vms/vm_detail.html", context, fragment="vm-live", status=status)


def _vm_context(request: HttpRequest, vm: VirtualMachine) -> dict:
    return {
        "nav": "vms",
        "vm": vm,
        "gpus": vm.live_allocations,
        "actions": selectors.vm_actions(vm),
        "can_change": tenant_change_allowed(request.user, vm.tenant_id),
        "events": selectors.vm_trail(vm=vm, user=request.user),
        "notice": InterruptionNotice.objects.filter(vm=vm, completed_at=None).first(),
        "notice_seconds": notice_seconds_for(vm) if is_operator(request.user) else None,
        "waiting": vm_waiting(vm),
        "polling_fast": vm.state in selectors.TRANSITIONAL,
    }

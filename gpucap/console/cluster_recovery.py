"""The cluster page's recovery policy panel (``console/cluster_recovery.html``, docs/bmc.md,
Recovery): the policy, and the form that sets it through the API's service (audited
``bmc.recovery_policy``). Turning the automatic power cycle on answers a confirmation first
(what it will do, with the values typed), which posts the same values confirmed; nothing is
saved before. Bad input answers 400 with the reason next to its field, and changes nothing."""

from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_http_methods

from gpucap.bmc import recovery
from gpucap.console.cluster_page import cluster_context
from gpucap.console.recovery_policy_panel import RecoveryPolicyForm, recovery_policy_context
from gpucap.fleet import selectors
from gpucap.fleet.models import Cluster
from gpucap.web.pages import operator_required, wants_fragment

TEMPLATE = "console/cluster_recovery.html"


@require_http_methods(["GET", "POST"])
@operator_required
def cluster_recovery_policy(request: HttpRequest, name: str) -> HttpResponse:
    """GET: the panel (a confirmation's Cancel); POST: set the policy."""
    cluster = get_object_or_404(Cluster, name=name)
    if request.method == "GET":
        if not wants_fragment(request):
            return redirect("fleet:cluster-detail", name=cluster.name)
        return _answer(request, cluster)
    policy = recovery.policy_of(cluster)
    form = RecoveryPolicyForm(request.POST, policy=policy)
    if form.is_valid() and (problems := recovery.policy_problems(form.values())):
        form.add_service_errors(ValidationError(problems))
    if form.errors:
        return _answer(request, cluster, form=form, status=400)
    values = form.values()
    turning_on = values["auto_power_cycle"] and not policy.auto_power_cycle
    if turning_on and not form.cleaned_data["confirmed"]:
        return _answer(request, cluster, form=form, confirm=values)
    recovery.recovery_policy_set(cluster=cluster, actor=request.user, **values)
    if not wants_fragment(request):
        return redirect("fleet:cluster-detail", name=cluster.name)
    return _answer(request, cluster, saved=True)


def _answer(request: HttpRequest, cluster: Cluster, *, status: int = 200, **panel) -> HttpResponse:
    """The panel for an HTMX swap; the cluster page around it otherwise."""
    if wants_fragment(request):
        context = {"cluster": cluster, **recovery_policy_context(cluster, **panel)}
        response = render(request, TEMPLATE, context, status=status)
    else:
        page = selectors.cluster_page(name=cluster.name)
        context = {**cluster_context(page), **recovery_policy_context(cluster, **panel)}
        response = render(request, "console/cluster_detail.html", context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response

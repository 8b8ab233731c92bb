"""The node page's BMC panel (``console/node_bmc.html``; docs/bmc.md): how gpucap reaches the
node's BMC, with the form that sets its credentials (the password never shown back) and their
confirmed removal; what the BMC last said the machine is; and **Rediscover**: a discovery of
the node with its stored credentials, read by a worker while the panel polls, then its preview
and **Apply** (or the refusal with the fresh preview, or the problems). Each view answers an
HTMX request with the panel alone; a request that cannot be done re-renders it with the reason
(400 next to the field it names, 409) and changes nothing."""

from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET, require_POST

from gpucap.bmc import discovery_runs, services
from gpucap.bmc.models import BmcCredential, DiscoveryRun
from gpucap.console.bmc_forms import BmcCredentialForm, bmc_context
from gpucap.console.node_page import node_context
from gpucap.errors import Conflict
from gpucap.fleet import selectors
from gpucap.fleet.models import Node
from gpucap.web.pages import operator_required, wants_fragment

TEMPLATE = "console/node_bmc.html"


@require_GET
@operator_required
def node_bmc(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    """The panel alone: what it polls while a discovery is being read or applied. The poll
    keeps the credentials form the page already shows (``hx-preserve``): an operator typing in
    it while a Rediscover is read loses nothing."""
    node = _node(cluster, hostname)
    if not wants_fragment(request):
        return redirect("fleet:node-detail", cluster=cluster, hostname=hostname)
    return _panel(request, node, keep_form=True)


@require_POST
@operator_required
def node_rediscover(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    """Start a discovery of the node with its stored address and credentials."""
    node = _node(cluster, hostname)
    try:
        discovery_runs.node_rediscover(node=node, actor=request.user)
    except ValidationError as exc:
        return _panel(request, node, error="; ".join(exc.messages), status=400)
    return _answer(request, node)


@require_POST
@operator_required
def node_discovery_apply(
    request: HttpRequest, cluster: str, hostname: str, run_id: int
) -> HttpResponse:
    """Apply the node's previewed discovery (a worker reads the BMC again first)."""
    node = _node(cluster, hostname)
    run = get_object_or_404(DiscoveryRun, pk=run_id, node=node)
    try:
        discovery_runs.discovery_apply_request(run=run, actor=request.user)
    except Conflict as exc:
        return _panel(request, node, error=exc.message, status=409)
    return _answer(request, node)


@require_POST
@operator_required
def node_bmc_credentials(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    """Set how gpucap logs in to the node's BMC (the service audits it, the password as
    "changed"). An empty password keeps the stored one."""
    node = _node(cluster, hostname)
    credential = BmcCredential.objects.filter(node=node).first()
    form = BmcCredentialForm(request.POST, credential=credential)
    if form.is_valid():
        try:
            services.bmc_credential_set(node=node, actor=request.user, **form.values())
        except ValidationError as error:
            form.add_service_errors(error)
    if form.errors:
        return _panel(request, node, form=form, status=400)
    if not wants_fragment(request):
        return redirect("fleet:node-detail", cluster=cluster, hostname=hostname)
    return _panel(request, node, notice="Credentials saved.")


@require_POST
@operator_required
def node_bmc_credentials_delete(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    """Forget the node's BMC credentials (confirmed in the page; audited); the address stays."""
    node = _node(cluster, hostname)
    services.bmc_credential_delete(node=node, actor=request.user)
    if not wants_fragment(request):
        return redirect("fleet:node-detail", cluster=cluster, hostname=hostname)
    return _panel(request, node, notice="Credentials removed.")


def _node(cluster: str, hostname: str) -> Node:
    return get_object_or_404(
        Node.objects.select_related("cluster"), cluster__name=cluster, hostname=hostname
    )


def _answer(request: HttpRequest, node: Node) -> HttpResponse:
    if not request.htmx:
        return redirect("fleet:node-detail", cluster=node.cluster.name, hostname=node.hostname)
    return _panel(request, node)


def _panel(
    request: HttpRequest,
    node: Node,
    *,
    error: str = "",
    notice: str = "",
    form: BmcCredentialForm | None = None,
    status: int = 200,
    keep_form: bool = False,
):
    """The panel for an HTMX swap; the whole node page (with the panel's error) otherwise."""
    said = {"bmc_error": error, "bmc_notice": notice}
    if wants_fragment(request):
        context = {
            "node": node,
            **bmc_context(node, form=form),
            **said,
            "keep_credentials_form": keep_form,
        }
        response = render(request, TEMPLATE, context, status=status)
    else:
        tile = selectors.node_with_gpus(cluster=node.cluster.name, hostname=node.hostname)
        context = {**node_context(tile), **said}
        if form is not None:
            context["credential_form"] = form
        response = render(request, "console/node_detail.html", context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response

"""The node page's recovery panel (``console/node_recovery.html``, docs/bmc.md, Recovery): where
recovery stands, the cluster's policy, the node's power cycles; an operator's Power-cycle of a
down node (confirmed) and Clear of a stopped recovery. Each answers an HTMX request with the
panel alone (``#node-recovery``), which polls itself while a cycle runs; a state that forbids
the action re-renders it with a 409 and the reason, and nothing changes. The cycle itself runs
in a worker (``bmc.power_cycle``)."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from gpucap.bmc import recovery
from gpucap.bmc.recovery_selectors import recovery_panel
from gpucap.console.node_page import node_context
from gpucap.errors import Conflict
from gpucap.fleet import selectors
from gpucap.web.pages import operator_required, render_page, wants_fragment

TEMPLATE = "console/node_recovery.html"
FRAGMENT = "node-recovery"


@require_GET
@operator_required
def node_recovery(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    """The panel, for its poll; a browser asking for it outright gets the node page."""
    if not request.htmx:
        return redirect("fleet:node-detail", cluster=cluster, hostname=hostname)
    return _answer(request, cluster, hostname, {})


@require_POST
@operator_required
def node_power_cycle(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    node = selectors.node_with_gpus(cluster=cluster, hostname=hostname).node
    try:
        recovery.power_cycle_request(node=node, actor=request.user)
    except Conflict as exc:
        return _answer(request, cluster, hostname, {"recovery_error": exc.message}, status=409)
    return _answer(request, cluster, hostname, {"power_cycle_requested": True})


@require_POST
@operator_required
def node_recovery_clear(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    node = selectors.node_with_gpus(cluster=cluster, hostname=hostname).node
    try:
        recovery.recovery_clear(node=node, actor=request.user)
    except Conflict as exc:
        return _answer(request, cluster, hostname, {"recovery_error": exc.message}, status=409)
    return _answer(request, cluster, hostname, {"recovery_cleared": True})


def _answer(request, cluster, hostname, context, *, status=200) -> HttpResponse:
    if status == 200 and not request.htmx:
        return redirect("fleet:node-detail", cluster=cluster, hostname=hostname)
    tile = selectors.node_with_gpus(cluster=cluster, hostname=hostname)
    if not wants_fragment(request):  # a refused form posted without HTMX: the whole page
        full = {**node_context(tile), **context}
        return render(request, "console/node_detail.html", full, status=status)
    panel = {"node": tile.node, "recovery": recovery_panel(tile.node), **context}
    return render_page(request, TEMPLATE, panel, fragment=FRAGMENT, status=status)

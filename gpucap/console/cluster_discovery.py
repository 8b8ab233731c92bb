"""The cluster page's "Discover machines" panel (``console/cluster_discovery.html``, docs/bmc.md):
an operator lists BMCs (address, user, password, TLS, and what the BMC cannot say), which
starts a discovery through the API's service; a worker reads them while the panel polls; the
preview's lines then, and Apply (read again, applied only if unchanged), or the problems, each
naming the node or the address. HTMX requests get the panel, or its discoveries part, alone; a
request that cannot be done answers 400 with the reasons next to the fields, or 409 saying
why, and changes nothing."""

from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET, require_POST

from gpucap.bmc import discovery_runs
from gpucap.bmc.discovery_runs import MAX_ENTRIES
from gpucap.bmc.models import DiscoveryRun
from gpucap.bmc.selectors import discovery_of_cluster
from gpucap.console.cluster_page import cluster_context
from gpucap.console.discovery_panel import (
    PREFIX,
    DiscoveryRowForm,
    DiscoveryRows,
    discovery_context,
)
from gpucap.errors import Conflict
from gpucap.fleet import selectors
from gpucap.fleet.models import Cluster
from gpucap.web.pages import operator_required, wants_fragment

TEMPLATE = "console/cluster_discovery.html"


@require_POST
@operator_required
def cluster_discover(request: HttpRequest, name: str) -> HttpResponse:
    """Start a discovery of the BMCs in the rows (a worker reads them)."""
    cluster = get_object_or_404(Cluster, name=name)
    rows = DiscoveryRows(request.POST)
    entries = rows.entries(cluster.name)
    run = None
    if entries is not None:
        try:
            run = discovery_runs.discovery_request(entries=entries, actor=request.user)
        except ValidationError as error:
            rows.add_service_errors(error)
    if run is None:
        return _answer(request, cluster, rows=rows, status=400)
    if not wants_fragment(request):
        return redirect("fleet:cluster-discovery", name=cluster.name, run_id=run.pk)
    return _answer(request, cluster, run=_run(cluster, run.pk))


@require_GET
@operator_required
def cluster_discover_row(request: HttpRequest, name: str) -> HttpResponse:
    """One more row for the form (``?index=`` its number), and the button that adds the next."""
    cluster = get_object_or_404(Cluster, name=name)
    if not wants_fragment(request):
        return redirect("fleet:cluster-detail", name=cluster.name)
    index = request.GET.get("index", "")
    if not index.isdigit() or not 0 < int(index) < 4 * MAX_ENTRIES:
        return HttpResponseBadRequest(f"index: a row number from 1, got {index[:20]!r}")
    context = {
        "cluster": cluster,
        "row": DiscoveryRowForm(prefix=f"{PREFIX}-{index}"),
        "next_index": int(index) + 1,
    }
    return render(request, f"{TEMPLATE}#discovery-row-added", context)


@require_GET
@operator_required
def cluster_discovery(request: HttpRequest, name: str, run_id: int) -> HttpResponse:
    """One discovery of the cluster's BMCs: what the panel polls while it is read or applied;
    opened as a page, the cluster page showing it."""
    cluster = get_object_or_404(Cluster, name=name)
    return _answer(request, cluster, run=_run(cluster, run_id), part=True)


@require_POST
@operator_required
def cluster_discovery_apply(request: HttpRequest, name: str, run_id: int) -> HttpResponse:
    """Apply a previewed discovery: a worker reads the BMCs again and applies the changes only
    if they are still the previewed ones."""
    cluster = get_object_or_404(Cluster, name=name)
    run = _run(cluster, run_id)
    try:
        discovery_runs.discovery_apply_request(run=run, actor=request.user)
    except Conflict as conflict:
        run = _run(cluster, run_id)
        return _answer(request, cluster, run=run, part=True, error=conflict.message, status=409)
    if not wants_fragment(request):
        return redirect("fleet:cluster-discovery", name=cluster.name, run_id=run_id)
    return _answer(request, cluster, run=_run(cluster, run_id), part=True)


def _run(cluster: Cluster, run_id: int) -> DiscoveryRun:
    run = discovery_of_cluster(cluster.name, run_id)
    if run is None:
        raise Http404(f"no discovery {run_id} of cluster {cluster.name}")
    return run


def _answer(
    request: HttpRequest,
    cluster: Cluster,
    *,
    run: DiscoveryRun | None = None,
    rows: DiscoveryRows | None = None,
    part: bool = False,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    """The panel (``part``: its discoveries alone) for an HTMX swap; the cluster page
    otherwise."""
    said = {"discovery_error": error}
    if wants_fragment(request):
        context = {"cluster": cluster, **discovery_context(cluster, run=run, rows=rows), **said}
        name = f"{TEMPLATE}#cluster-discoveries" if part else TEMPLATE
        response = render(request, name, context, status=status)
    else:
        page = selectors.cluster_page(name=cluster.name)
        context = {**cluster_context(page, run=run, rows=rows), **said}
        response = render(request, "console/cluster_detail.html", context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response

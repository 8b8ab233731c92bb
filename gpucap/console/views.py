"""The operators' console: the fleet overview grid, clusters, capacity sets (with the arbiter's
panels of gpucap.plans), node detail with cordon/uncordon, and drains of a node or a whole set
(with who holds a drain up, from gpucap.notices).

Views adapt the request and call selectors (reads) or services (changes); nothing here
decides a rule of the fleet.
"""

from dataclasses import dataclass
from urllib.parse import urlencode

from django import forms
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from gpucap.console.cluster_page import cluster_context
from gpucap.console.node_page import node_context
from gpucap.console.schedule import schedule_context
from gpucap.errors import Conflict
from gpucap.fleet import selectors, services
from gpucap.fleet.models import CapacitySet, Node
from gpucap.notices import drains
from gpucap.notices.selectors import drain_blockers_by_node
from gpucap.plans.views import SET_CHANGED, set_page_context, what_if_context
from gpucap.usage.views import AllocationSpan, allocation_context, allocation_span
from gpucap.web.live import content_key
from gpucap.web.pages import operator_required, render_page


class FleetFilterForm(forms.Form):
    """The overview's filters. Choices come from the fleet, so a stale link that names a
    cluster or set that no longer exists says so instead of silently showing everything."""

    cluster = forms.ChoiceField(required=False)
    capacity_set = forms.ChoiceField(required=False, label="Capacity set")
    state = forms.ChoiceField(required=False, label="Node state")
    gpu_model = forms.ChoiceField(required=False, label="GPU model")

    def __init__(self, data, *, options: selectors.FleetFilterOptions) -> None:
        super().__init__(data)
        self.fields["cluster"].choices = [("", "All clusters"), *[(c, c) for c in options.clusters]]
        self.fields["capacity_set"].choices = [
            ("", "All sets"),
            (selectors.STANDALONE, "Standalone nodes"),
            *[(s, s) for s in options.capacity_sets],
        ]
        self.fields["state"].choices = [("", "Any state"), *options.states]
        self.fields["gpu_model"].choices = [
            ("", "All models"),
            *[(m, m) for m in options.gpu_models],
        ]

    def filters(self) -> dict[str, str]:
        """The valid filters; an invalid one is dropped (and reported through ``errors``)."""
        self.is_valid()
        return {name: value for name, value in self.cleaned_data.items() if value}


@require_GET
@operator_required
def fleet_overview(request: HttpRequest) -> HttpResponse:
    form = FleetFilterForm(request.GET, options=selectors.fleet_filter_options())
    filters = form.filters()
    overview = selectors.fleet_overview(**filters)
    context = {"nav": "fleet", "form": form, "filtered": bool(filters), "overview": overview}
    return render_page(request, "console/overview.html", context, fragment="fleet-grid")


@require_GET
@operator_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    context = {"nav": "fleet", "clusters": selectors.clusters_with_totals()}
    return render(request, "console/cluster_list.html", context)


@require_GET
@operator_required
def cluster_detail(request: HttpRequest, name: str) -> HttpResponse:
    """A cluster: its driver and settings (a rig whose VMs get no GPUs says so loudly), its
    nodes with their guest networks, its sets, its image catalogue, and the discovery of
    machines by their BMCs (`gpucap.console.cluster_discovery`)."""
    context = cluster_context(selectors.cluster_page(name=name))
    return render(request, "console/cluster_detail.html", context)


@require_GET
@operator_required
def capacity_set_list(request: HttpRequest) -> HttpResponse:
    context = {
        "nav": "capacity_sets",
        "capacity_sets": selectors.capacity_sets_with_totals(),
        "standalone_pools": selectors.standalone_pools(),
    }
    return render_page(request, "console/capacity_set_list.html", context, fragment="set-table")


@require_GET
@operator_required
def capacity_set_detail(request: HttpRequest, name: str) -> HttpResponse:
    """The set: its header, its arbiter (mode, pool bars, the plan in flight, the latest plan,
    history; gpucap.plans.views), its pools and nodes and its allocation chart, all live, the
    what-if form, and its schedule (gpucap.console.schedule; the 24-hour timeline loads on its
    own). A fixed number of queries whatever the set's size."""
    return _set_page(request, name)


@require_GET
@operator_required
def capacity_set_live(request: HttpRequest, name: str) -> HttpResponse:
    """The set page's poll: 204 while the page shows what a fresh render would (``since`` is
    the key of what it shows; the chart is not even drawn then), else every live region, each
    replacing itself out of band, and the poll with the new key. Opened as a page, it leads to
    the set page."""
    if not request.htmx:
        return redirect("fleet:capacity-set-detail", name=name)
    regions = _set_regions(request, name)
    if request.GET.get("since") == regions.key:
        response = HttpResponse(status=204)
    else:
        context = {**regions.context, "live_key": regions.key}
        context.update(allocation_context(context["capacity_set"], span=regions.span))
        chart = render_to_string("console/set_chart.html", context, request=request)
        poll = render_to_string("console/set_poll.html", context, request=request)
        response = HttpResponse(regions.html + chart + poll)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@operator_required
def capacity_set_drain(request: HttpRequest, name: str) -> HttpResponse:
    """Drain every node of the set. Under HTMX the answer is what happened, for the page's
    alert, and the event that makes the page's poll show the draining set at once."""
    capacity_set = get_object_or_404(CapacitySet, name=name)
    alert, status = "", 200
    try:
        drains.capacity_set_drain(capacity_set=capacity_set, actor=request.user)
    except Conflict as exc:
        alert, status = f"Not changed: {exc.message}", 409
    if request.htmx:
        response = render(request, "plans/alert.html", {"alert": alert}, status=status)
        response["HX-Trigger"] = SET_CHANGED
        return response
    if status == 200:
        return redirect("fleet:capacity-set-detail", name=name)
    return _set_page(request, name, alert=alert, status=status)


def _set_page(
    request: HttpRequest, name: str, *, alert: str = "", status: int = 200
) -> HttpResponse:
    regions = _set_regions(request, name)
    capacity_set, pools = regions.context["capacity_set"], regions.context["overview"].pools
    context = {
        **regions.context,
        **what_if_context(capacity_set, pools=pools),
        **schedule_context(capacity_set, now=timezone.now()),
        "regions": regions.html,
        "live_key": regions.key,
        "alert": alert,
    }
    return render(request, "console/capacity_set_detail.html", context, status=status)


# Up to this many nodes the set page draws every GPU; a larger set gets a count per node state
# and a link to the fleet overview's grid of the set (16,000 squares would slow the page down).
GRID_NODE_LIMIT = 64


@dataclass(frozen=True)
class SetRegions:
    """The live regions of a set page but the chart, rendered, the context they were rendered
    with, the chart's span, and the key of what the page shows: the regions, and the chart by
    its last step (its averages move with the clock; it is redrawn with any other change, and
    when a new step begins)."""

    html: str
    context: dict
    span: AllocationSpan
    key: str


def _set_regions(request: HttpRequest, name: str) -> SetRegions:
    """Every live region of the set page but the chart, in a fixed number of queries whatever
    the set's size: the header, the arbiter, the plans, the pools and nodes."""
    set_nodes = selectors.capacity_set_nodes(name=name, grid_limit=GRID_NODE_LIMIT)
    overview, capacity_set = set_nodes.overview, set_nodes.overview.capacity_set
    draining = [node for node in set_nodes.nodes if node.state == Node.State.DRAINING]
    blockers = drain_blockers_by_node(draining)  # two queries for all of them
    context = {
        **set_page_context(capacity_set, pools=overview.pools, gpu_total=overview.totals.gpus),
        "nav": "capacity_sets",
        "overview": overview,
        # A cordoned node may still be drained on its own page; the set's button is for a
        # set in service.
        "can_drain": any(node.state == Node.State.READY for node in set_nodes.nodes),
        "node_count": len(set_nodes.nodes),
        "held_up": [(node, blockers[node.pk]) for node in draining],
        "show_grid": set_nodes.grid,
        "node_states": set_nodes.states,
        "grid_query": urlencode({"capacity_set": capacity_set.name}),
    }
    span = allocation_span(request.GET.get("days", ""))
    html = render_to_string("console/set_regions.html", context, request=request)
    return SetRegions(
        html=html, context=context, span=span, key=content_key(html, span.days, span.last_step)
    )


@require_GET
@operator_required
def node_detail(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    """The node page; its live parts poll it: the state, GPUs and drain (``node-live``), and,
    while other tenants' VMs still hold a dedicated node, the dedication panel
    (``?part=dedication``)."""
    tile = selectors.node_with_gpus(cluster=cluster, hostname=hostname)
    fragment = "node-dedication" if request.GET.get("part") == "dedication" else "node-live"
    return render_page(request, "console/node_detail.html", node_context(tile), fragment=fragment)


@require_POST
@operator_required
def node_cordon(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    return _node_change_state(request, cluster, hostname, services.node_cordon)


@require_POST
@operator_required
def node_uncordon(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    return _node_change_state(request, cluster, hostname, services.node_uncordon)


@require_POST
@operator_required
def node_drain(request: HttpRequest, cluster: str, hostname: str) -> HttpResponse:
    return _node_change_state(request, cluster, hostname, drains.node_drain)


def _node_change_state(request: HttpRequest, cluster: str, hostname: str, change) -> HttpResponse:
    """Call the service; answer with the refreshed node (or the reason it did not change)."""
    tile = selectors.node_with_gpus(cluster=cluster, hostname=hostname)
    error, status = "", 200
    try:
        change(node=tile.node, actor=request.user)
    except Conflict as exc:
        error, status = exc.message, 409
    except ValidationError as exc:
        error, status = "; ".join(exc.messages), 400
    if status == 200 and not request.htmx:
        return redirect("fleet:node-detail", cluster=cluster, hostname=hostname)
    tile = selectors.node_with_gpus(cluster=cluster, hostname=hostname)
    context = {**node_context(tile), "error": error}
    return render_page(
        request, "console/node_detail.html", context, fragment="node-live", status=status
    )

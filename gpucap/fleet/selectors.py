"""Reads of the fleet for pages (and later the API), each in a fixed number of queries.

A GPU's ``status`` is the one word the grid colours it by: a failed card is ``failed``; a card
held by a VM is its pool's kind (``on_demand``, ``spot``, ``inference``), or ``leaving`` while
the VM is under notice or stopping; otherwise its node's state, or ``free`` on a ready node.
"""

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from django.db.models import (
    Count,
    F,
    FilteredRelation,
    IntegerField,
    OuterRef,
    Prefetch,
    Q,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404

from gpucap.arbiter.topology import NVLINK_PARTITION_SIZES, default_partitions
from gpucap.fleet.models import CapacitySet, Cluster, Gpu, Image, Node, Pool

STANDALONE = "standalone"

# Every status the grid can show, in legend order, with the words the legend uses.
GPU_STATUSES = (
    ("free", "Free"),
    ("on_demand", "On-demand VM"),
    ("spot", "Spot VM"),
    ("inference", "Inference replica"),
    ("leaving", "Under notice or stopping"),
    ("failed", "Failed GPU"),
    ("cordoned", "Node cordoned"),
    ("draining", "Node draining"),
    ("down", "Node down"),
)


def gpu_status(
    *, node_state: str, health: str, holder_kind: str | None = None, holder_state: str | None = None
) -> str:
    # A failed card stays visible as failed whatever its node does: it needs a repair either way.
    if health == Gpu.Health.FAILED:
        return "failed"
    if holder_kind is not None:
        return "leaving" if holder_state in _LEAVING else holder_kind
    if node_state != Node.State.READY:
        return node_state
    return "free"


_LEAVING = ("notified", "stopping")


def with_holders(gpus):
    """GPUs with ``holder_kind`` / ``holder_state``: the pool kind and state of the VM holding
    each (None when free). One LEFT JOIN through the live-allocation index (at most one live
    holder per GPU, so no row is repeated); correlated subqueries here cost PostgreSQL 30x more
    on a 16,000-GPU set."""
    return gpus.annotate(
        live=FilteredRelation("allocations", condition=Q(allocations__released_at=None)),
        holder_kind=F("live__vm__pool__kind"),
        holder_state=F("live__vm__state"),
    )


@dataclass(frozen=True)
class GpuSquare:
    """One GPU as the grid shows it. Plain values, not a model: a 2,000-node grid builds
    16,000 of these."""

    index: int
    uuid: str
    pci_address: str
    health: str
    status: str

    @property
    def failed(self) -> bool:
        return self.health == Gpu.Health.FAILED


@dataclass(frozen=True)
class NodeTile:
    node: Node
    squares: list[GpuSquare]

    @property
    def failed_gpus(self) -> int:
        return sum(1 for square in self.squares if square.failed)


@dataclass
class NodeGroup:
    """Nodes of one capacity set, or one cluster's standalone nodes."""

    cluster: Cluster
    capacity_set: CapacitySet | None
    tiles: list[NodeTile] = field(default_factory=list)

    @property
    def gpu_total(self) -> int:
        return sum(len(tile.squares) for tile in self.tiles)


@dataclass(frozen=True)
class FleetTotals:
    nodes: int
    gpus: int
    failed_gpus: int
    nodes_not_ready: int
    ready_gpus: int
    by_status: dict[str, int]

    @property
    def legend(self) -> list[tuple[str, str, int]]:
        return [(status, label, self.by_status.get(status, 0)) for status, label in GPU_STATUSES]


def node_tiles(nodes) -> list[NodeTile]:
    """Tiles for the given nodes, with their GPUs read in one query."""
    nodes = list(nodes)
    squares: dict[int, list[GpuSquare]] = defaultdict(list)
    state_of = {node.pk: node.state for node in nodes}
    rows = (
        with_holders(Gpu.objects.filter(node_id__in=state_of))
        .order_by("node_id", "index")
        .values_list(
            "node_id", "index", "uuid", "pci_address", "health", "holder_kind", "holder_state"
        )
    )
    for node_id, index, uuid, pci_address, health, holder_kind, holder_state in rows:
        squares[node_id].append(
            GpuSquare(
                index=index,
                uuid=uuid,
                pci_address=pci_address,
                health=health,
                status=gpu_status(
                    node_state=state_of[node_id],
                    health=health,
                    holder_kind=holder_kind,
                    holder_state=holder_state,
                ),
            )
        )
    return [NodeTile(node=node, squares=squares[node.pk]) for node in nodes]


def fleet_totals(tiles: list[NodeTile]) -> FleetTotals:
    by_status = Counter(square.status for tile in tiles for square in tile.squares)
    return FleetTotals(
        nodes=len(tiles),
        gpus=sum(len(tile.squares) for tile in tiles),
        failed_gpus=sum(tile.failed_gpus for tile in tiles),
        nodes_not_ready=sum(1 for tile in tiles if tile.node.state != Node.State.READY),
        ready_gpus=by_status.get("free", 0),
        by_status=dict(by_status),
    )


def _nodes():
    return Node.objects.select_related("cluster", "capacity_set", "dedicated_tenant").order_by(
        "cluster__name", "capacity_set__name", "hostname"
    )


def _grid_nodes():
    """Nodes with only what a tile shows: loading timestamps and JSON for 2,000 rows costs more
    than the rest of the page."""
    return _nodes().defer(
        "created_at",
        "updated_at",
        "partitions",
        "labels",
        "bmc_address",
        "cluster__driver_settings",
        "cluster__created_at",
        "capacity_set__created_at",
        "capacity_set__updated_at",
        "dedicated_tenant__created_at",
    )


# --- fleet overview ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetFilterOptions:
    clusters: list[str]
    capacity_sets: list[str]
    gpu_models: list[str]
    states: list[tuple[str, str]]


def fleet_filter_options() -> FleetFilterOptions:
    return FleetFilterOptions(
        clusters=list(Cluster.objects.order_by("name").values_list("name", flat=True)),
        capacity_sets=list(CapacitySet.objects.order_by("name").values_list("name", flat=True)),
        gpu_models=list(
            Node.objects.order_by("gpu_model").values_list("gpu_model", flat=True).distinct()
        ),
        states=list(Node.State.choices),
    )


@dataclass(frozen=True)
class FleetOverview:
    groups: list[NodeGroup]
    totals: FleetTotals


def fleet_overview(
    *, cluster: str = "", capacity_set: str = "", state: str = "", gpu_model: str = ""
) -> FleetOverview:
    """Every node matching the filters, grouped by cluster, then capacity set (standalone nodes
    last). ``capacity_set`` is a set's name or ``"standalone"``. Two queries: nodes, GPUs."""
    nodes = _grid_nodes()
    if cluster:
        nodes = nodes.filter(cluster__name=cluster)
    if capacity_set == STANDALONE:
        nodes = nodes.filter(capacity_set__isnull=True)
    elif capacity_set:
        nodes = nodes.filter(capacity_set__name=capacity_set)
    if state:
        nodes = nodes.filter(state=state)
    if gpu_model:
        nodes = nodes.filter(gpu_model=gpu_model)
    tiles = node_tiles(nodes)

    groups: dict[tuple[int, int | None], NodeGroup] = {}
    for tile in tiles:
        node = tile.node
        key = (node.cluster_id, node.capacity_set_id)
        if key not in groups:
            groups[key] = NodeGroup(cluster=node.cluster, capacity_set=node.capacity_set)
        groups[key].tiles.append(tile)
    ordered = sorted(
        groups.values(),
        key=lambda g: (
            g.cluster.name,
            g.capacity_set is None,
            g.capacity_set and g.capacity_set.name,
        ),
    )
    return FleetOverview(groups=ordered, totals=fleet_totals(tiles))


# --- capacity sets ----------------------------------------------------------------------------


def _count(queryset) -> Subquery:
    """A correlated COUNT(*) of ``queryset`` as an annotation (no join fan-out)."""
    return Coalesce(
        Subquery(
            queryset.order_by().values(dummy=OuterRef("pk")).annotate(n=Count("*")).values("n"),
            output_field=IntegerField(),
        ),
        0,
    )


def capacity_sets_with_totals():
    """Capacity sets with node and GPU totals and their pools in rank order. Two queries."""
    set_nodes = Node.objects.filter(capacity_set=OuterRef("pk"))
    set_gpus = Gpu.objects.filter(node__capacity_set=OuterRef("pk"))
    return (
        CapacitySet.objects.select_related("cluster")
        .annotate(
            node_count=_count(set_nodes),
            gpu_total=Coalesce(
                Subquery(
                    set_nodes.order_by()
                    .values("capacity_set")
                    .annotate(total=Sum("gpu_count"))
                    .values("total"),
                    output_field=IntegerField(),
                ),
                0,
            ),
            nodes_not_ready=_count(set_nodes.exclude(state=Node.State.READY)),
            ready_gpus=_count(set_gpus.filter(node__state=Node.State.READY, health=Gpu.Health.OK)),
            failed_gpus=_count(set_gpus.filter(health=Gpu.Health.FAILED)),
        )
        .prefetch_related(Prefetch("pools", queryset=Pool.objects.order_by("rank")))
        .order_by("cluster__name", "name")
    )


def standalone_pools():
    """Pools outside any capacity set, with the tenants that may use them. Two queries."""
    return (
        Pool.objects.filter(capacity_set__isnull=True)
        .select_related("cluster")
        .prefetch_related("tenants")
        .order_by("cluster__name", "rank")
    )


@dataclass(frozen=True)
class CapacitySetOverview:
    capacity_set: CapacitySet
    pools: list[Pool]
    tiles: list[NodeTile]
    totals: FleetTotals


@dataclass(frozen=True)
class NodeStateCount:
    state: str
    label: str
    nodes: int
    gpus: int
    failed_gpus: int


@dataclass(frozen=True)
class SetNodes:
    """A capacity set's overview for its page. Up to ``grid_limit`` nodes it has a tile per
    node (every GPU drawn); a larger set has no tiles, its GPUs counted by the database instead
    of read one by one (16,000 rows for 2,000 nodes), and a count per node state."""

    overview: CapacitySetOverview
    nodes: list[Node]
    grid: bool
    states: list[NodeStateCount]


# What a tile or the node summary shows of a node: 2,000 full rows (timestamps, JSON) cost more
# than the rest of the page.
_NODE_FIELDS = (
    "id",
    "hostname",
    "state",
    "gpu_count",
    "gpu_model",
    "fabric",
    "cluster_id",
    "capacity_set_id",
    "dedicated_tenant_id",
)


def capacity_set_nodes(*, name: str, grid_limit: int) -> SetNodes:
    """One set: its pools in rank order (with tenants), its nodes, and totals. Up to
    ``grid_limit`` nodes with a tile per node (every GPU); a larger set's GPUs are counted by
    the database instead. Five queries either way: set, pools, pool tenants, nodes, and GPUs
    (rows or counts)."""
    capacity_set = get_object_or_404(CapacitySet.objects.select_related("cluster"), name=name)
    pools = list(capacity_set.pools.order_by("rank").prefetch_related("tenants"))
    nodes = list(
        Node.objects.filter(capacity_set=capacity_set)
        .select_related("dedicated_tenant")  # tiles mark dedicated nodes: a join, no query
        .only(*_NODE_FIELDS, "dedicated_tenant__slug", "dedicated_tenant__name")
        .order_by("hostname")
    )
    for node in nodes:  # every node is the set's and its cluster's: no join, no per-row query
        node.cluster, node.capacity_set = capacity_set.cluster, capacity_set
    if len(nodes) <= grid_limit:
        tiles = node_tiles(nodes)
        totals = fleet_totals(tiles)
        failed = Counter()
        for tile in tiles:
            failed[tile.node.state] += tile.failed_gpus
    else:
        tiles = []
        counts = (
            with_holders(Gpu.objects.filter(node__capacity_set=capacity_set))
            .order_by()
            .values_list("node__state", "health", "holder_kind", "holder_state")
            .annotate(n=Count("pk"))
        )
        by_status: Counter = Counter()
        failed = Counter()
        for node_state, health, holder_kind, holder_state, n in counts:
            status = gpu_status(
                node_state=node_state,
                health=health,
                holder_kind=holder_kind,
                holder_state=holder_state,
            )
            by_status[status] += n
            if health == Gpu.Health.FAILED:
                failed[node_state] += n
        totals = FleetTotals(
            nodes=len(nodes),
            gpus=sum(by_status.values()),
            failed_gpus=sum(failed.values()),
            nodes_not_ready=sum(1 for node in nodes if node.state != Node.State.READY),
            ready_gpus=by_status.get("free", 0),
            by_status=dict(by_status),
        )
    per_state = Counter(node.state for node in nodes)
    gpus_per_state = Counter()
    for node in nodes:
        gpus_per_state[node.state] += node.gpu_count
    return SetNodes(
        overview=CapacitySetOverview(
            capacity_set=capacity_set, pools=pools, tiles=tiles, totals=totals
        ),
        nodes=nodes,
        grid=len(nodes) <= grid_limit,
        states=[
            NodeStateCount(
                state=state,
                label=label,
                nodes=per_state[state],
                gpus=gpus_per_state[state],
                failed_gpus=failed[state],
            )
            for state, label in Node.State.choices
        ],
    )


# --- node -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionRow:
    size: int
    blocks: list[list[int]]


@dataclass(frozen=True)
class PartitionTable:
    is_default: bool
    rows: list[PartitionRow]


def partition_table(node: Node) -> PartitionTable | None:
    """The node's NVLink partitions grouped by size, largest first; None for PCIe nodes."""
    if node.fabric != "nvswitch":
        return None
    is_default = node.partitions is None
    blocks = (
        [list(b) for b in default_partitions(node.gpu_count)] if is_default else node.partitions
    )
    rows = [
        PartitionRow(size=size, blocks=[b for b in blocks if len(b) == size])
        for size in sorted(NVLINK_PARTITION_SIZES, reverse=True)
    ]
    return PartitionTable(is_default=is_default, rows=[row for row in rows if row.blocks])


def node_with_gpus(*, cluster: str, hostname: str) -> NodeTile:
    """One node with its cluster, set and GPUs. Two queries; 404 when it does not exist."""
    node = get_object_or_404(_nodes(), cluster__name=cluster, hostname=hostname)
    return node_tiles([node])[0]


def images_offered(*, cluster_id: int) -> list[Image]:
    """The enabled images of a cluster's catalogue, by name: what a tenant may choose for a VM
    of a pool of that cluster. One query."""
    return images_offered_on(cluster_ids=[cluster_id])


def images_offered_on(*, cluster_ids) -> list[Image]:
    """The enabled images of these clusters, by cluster name, then image name. One query."""
    images = Image.objects.filter(cluster_id__in=cluster_ids, enabled=True)
    return list(images.select_related("cluster").order_by("cluster__name", "name"))


# --- clusters ----------------------------------------------------------------------------------


def clusters_with_totals():
    """Every cluster with its node and GPU counts and its sets' names (API and page)."""
    return Cluster.objects.annotate(
        node_count=Count("nodes"), gpu_total=Coalesce(Sum("nodes__gpu_count"), 0)
    ).prefetch_related(Prefetch("capacity_sets", CapacitySet.objects.only("cluster", "name")))


@dataclass(frozen=True)
class ClusterPage:
    cluster: Cluster
    settings: list[tuple[str, str]]  # the driver settings, by name, as written
    nodes: list
    capacity_sets: list
    images: list


def cluster_page(*, name: str) -> ClusterPage:
    """One cluster as its page shows it: driver and settings, nodes (with set, state, GPU
    count and guest network), capacity sets and catalogue images. 404 for an unknown name."""
    cluster = get_object_or_404(Cluster, name=name)
    nodes = list(
        Node.objects.filter(cluster=cluster).select_related("capacity_set").order_by("hostname")
    )
    return ClusterPage(
        cluster=cluster,
        settings=sorted(
            (key, value if isinstance(value, str) else json.dumps(value))
            for key, value in (cluster.driver_settings or {}).items()
        ),
        nodes=nodes,
        capacity_sets=list(cluster.capacity_sets.order_by("name")),
        images=list(Image.objects.filter(cluster=cluster).order_by("name")),
    )

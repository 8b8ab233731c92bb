"""Placement outside capacity sets (DESIGN.md section 3, last paragraph).

A cluster's standalone pools (in no capacity set) place their pending VMs on free capacity of the
cluster's standalone nodes whose GPU model and fabric are the pool's, by pool rank, then request
time, then id (rule 8). A higher-ranked placement may preempt a standalone **spot** VM with an
immediate stop and no notice, as Kubernetes scheduler preemption does; on-demand and inference
VMs are never preempted here.

There is no second planner: each hardware class (GPU model, fabric) of the cluster's standalone
nodes becomes an arbiter `Snapshot`, and `gpucap.arbiter.plan` decides, with its rules on
topology, free capacity first, floors and least disruption. This module only translates the
database into a snapshot and the plan into service calls:

- each preemption -> ``services.vm_preempt`` (the victim stops at once; it goes back to pending
  when it is off, as a persistent spot request);
- each placement on GPUs that are free now -> ``services.vm_place``;
- a placement that needs victims waits: its victims point at it (``preempted_for``), their GPUs
  and the free rest of its block are reserved for it, and it gets no second round of victims
  while they stop. When they are off, ``vm_mark_stopped`` sends ``rentals.standalone_place``
  again and the VM is placed then, on free capacity;
- an unsatisfied demand stays pending, its reason logged.

Inside a capacity set placement is the arbiter's (plans, dry-run, notices): VMs of set pools
are never placed here.

Runs for one cluster are serialised by a PostgreSQL transaction-level advisory lock (see
``LOCK_CLASS_STANDALONE_PLACEMENT``), so two workers never plan the same free GPUs at once; the
partial unique index on live allocations is the last line either way.
"""

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from gpucap import arbiter
from gpucap.arbiter import model as am
from gpucap.arbiter.topology import gpu_count_problem, gpu_mask, partition_table
from gpucap.errors import Conflict
from gpucap.fleet.models import Gpu, Node, Pool
from gpucap.rentals import services
from gpucap.rentals.models import Allocation, VirtualMachine

logger = logging.getLogger(__name__)

State = VirtualMachine.State

# PostgreSQL advisory locks in gpucap use the two-key form ``(class, object id)``; the class says
# what the id is, so ids of different tables never collide (and two-key locks never collide
# with one-key bigint locks). Classes are four ASCII letters read as a 32-bit integer:
#   0x67707663 'gpvc'  driver work on one VM, id = VM id        (rentals.reconcile, session lock)
#   0x67707370 'gpsp'  standalone placement, id = cluster id    (here, transaction lock)
#   0x67706373 'gpcs'  reserved: applying plans to one capacity set, id = capacity set id
LOCK_CLASS_STANDALONE_PLACEMENT = 0x67707370

# What the arbiter sees of a VM's state: GPUs of a VM that is leaving are reserved, and such a VM
# is never chosen as a victim again.
_SNAPSHOT_STATE = {
    State.PROVISIONING: "running",
    State.RUNNING: "running",
    State.NOTIFIED: "notified",
    State.STOPPING: "notified",
}
# VMs already on their way out for a placement: that placement waits for them.
_IN_FLIGHT = (State.NOTIFIED, State.STOPPING)
# The snapshot pool standing for VMs on these nodes that belong to no pool of the hardware
# class (placed by hand, or left behind when a node left a capacity set): never victims here.
_OTHER_POOLS = "(other pools)"


# --- what a run did ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    vm_id: int
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Preempted:
    vm_id: int
    for_vm_id: int
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Unplaced:
    vm_id: int
    reason: str


@dataclass
class PlacementResult:
    """One run for one cluster. ``waiting`` lists VMs whose placement needs victims that are
    stopping (preempted in this run or earlier); ``unsatisfied`` the VMs that stay pending."""

    cluster_id: int
    placed: list[Placed] = field(default_factory=list)
    preempted: list[Preempted] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    unsatisfied: list[Unplaced] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.placed or self.preempted)


# --- the run -------------------------------------------------------------------------------------


@transaction.atomic
def standalone_place(*, cluster_id: int) -> PlacementResult:
    """Place the pending VMs of the cluster's standalone pools (see the module docs). Harmless
    to run at any time and any number of times: a run with nothing new to do changes nothing."""
    _lock_cluster(cluster_id)
    result = PlacementResult(cluster_id=cluster_id)
    fleet = _StandaloneFleet.load(cluster_id)
    for hardware in sorted(fleet.demand_classes()):
        _place_class(fleet, hardware, result)
    return result


def _lock_cluster(cluster_id: int) -> None:
    """Wait for any other placement run of this cluster; held until this transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)",
            [LOCK_CLASS_STANDALONE_PLACEMENT, _int4(cluster_id)],
        )


def _int4(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


Hardware = tuple[str, str]  # (GPU model, fabric)


@dataclass
class _StandaloneFleet:
    """The cluster's standalone nodes, pools, the VMs holding GPUs there and the pending VMs,
    read once (a fixed number of queries) after the lock is taken."""

    cluster_id: int
    now: datetime
    pools: dict[int, Pool]
    nodes: dict[int, Node]
    failed: dict[int, set[int]]  # node id -> failed GPU indices
    holders: dict[int, VirtualMachine]  # VMs holding GPUs on these nodes
    held: dict[int, dict[int, list[int]]]  # VM id -> node id -> GPU indices
    victims: dict[int, list[int]]  # pending VM id -> ids of its victims still leaving
    pending: list[VirtualMachine]  # with ``waits_for_victims``

    @classmethod
    def load(cls, cluster_id: int) -> "_StandaloneFleet":
        pools = {
            pool.pk: pool
            for pool in Pool.objects.filter(cluster_id=cluster_id, capacity_set__isnull=True)
        }
        nodes = {
            node.pk: node
            for node in Node.objects.filter(cluster_id=cluster_id, capacity_set__isnull=True)
        }
        failed: dict[int, set[int]] = defaultdict(set)
        for node_id, index in Gpu.objects.filter(
            node_id__in=nodes, health=Gpu.Health.FAILED
        ).values_list("node_id", "index"):
            failed[node_id].add(index)
        held: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        holders: dict[int, VirtualMachine] = {}
        for allocation in Allocation.objects.filter(
            released_at=None, gpu__node_id__in=nodes
        ).select_related("vm__tenant", "gpu"):
            held[allocation.vm_id][allocation.gpu.node_id].append(allocation.gpu.index)
            holders[allocation.vm_id] = allocation.vm
        in_flight = VirtualMachine.objects.filter(
            preempted_for=OuterRef("pk"), state__in=_IN_FLIGHT
        )
        pending = list(
            VirtualMachine.objects.filter(state=State.PENDING, pool_id__in=pools)
            .annotate(waits_for_victims=Exists(in_flight))
            .select_related("pool", "tenant")
            .order_by("requested_at", "pk")
        )
        victims: dict[int, list[int]] = defaultdict(list)
        for vm in holders.values():
            if vm.preempted_for_id is not None and vm.state in _IN_FLIGHT:
                victims[vm.preempted_for_id].append(vm.pk)
        return cls(
            cluster_id=cluster_id,
            now=timezone.now(),
            pools=pools,
            nodes=nodes,
            failed=failed,
            holders=holders,
            held=held,
            victims=victims,
            pending=pending,
        )

    def demand_classes(self) -> set[Hardware]:
        return {(vm.pool.gpu_model, vm.pool.fabric) for vm in self.pending}


def _place_class(fleet: _StandaloneFleet, hardware: Hardware, result: PlacementResult) -> None:
    gpu_model, fabric = hardware
    snapshot = _snapshot(fleet, hardware)
    problems = arbiter.snapshot_problems(snapshot)
    if problems:
        # Cannot happen through the services; if it does, place nothing rather than guess.
        logger.error(
            "standalone placement in cluster %s for %s %s skipped: %s",
            result.cluster_id,
            gpu_model,
            fabric,
            "; ".join(problems),
        )
        return
    plan = arbiter.plan(snapshot)
    _apply(fleet, plan, result)


# --- database -> snapshot ------------------------------------------------------------------------


def _snapshot(fleet: _StandaloneFleet, hardware: Hardware) -> am.Snapshot:
    gpu_model, fabric = hardware
    pools = {
        pool_id: pool
        for pool_id, pool in fleet.pools.items()
        if (pool.gpu_model, pool.fabric) == hardware
    }
    nodes = _ClassNodes(
        fabric,
        {
            node_id: node
            for node_id, node in fleet.nodes.items()
            if (node.gpu_model, node.fabric) == hardware
        },
        fleet.failed,
    )
    vms: list[am.Vm] = []
    for vm_id, by_node in sorted(fleet.held.items()):
        vm = fleet.holders[vm_id]
        here = {node_id: gpus for node_id, gpus in by_node.items() if node_id in nodes.nodes}
        if not here:
            continue
        node_id, gpus = next(iter(here.items()))
        if len(by_node) != 1 or not nodes.is_partition(node_id, gpus):
            # Placed by hand on GPUs that are not one partition of the table: leave it alone.
            logger.warning(
                "%s holds GPUs %s that are not one partition of a node's table; standalone "
                "placement leaves them alone",
                vm.instance_id,
                {fleet.nodes[n].hostname: sorted(g) for n, g in by_node.items()},
            )
            for other_node, other_gpus in here.items():
                nodes.make_unusable(other_node, other_gpus)
            continue
        vms.append(
            am.Vm(
                id=vm.instance_id,
                pool=pools[vm.pool_id].name if vm.pool_id in pools else _OTHER_POOLS,
                node=nodes.nodes[node_id].hostname,
                gpus=tuple(sorted(gpus)),
                started_at=vm.started_at or fleet.now,
                state=_SNAPSHOT_STATE[vm.state],
                tenant=vm.tenant.slug,
            )
        )
        nodes.hold(node_id, gpus)
    vms.extend(_reservations(fleet, pools, nodes))
    snapshot_pools = [
        am.Pool(
            name=pool.name,
            # Outside a set only spot VMs may be preempted: on-demand and inference pools enter
            # the snapshot as on_demand, which the arbiter never preempts (rule 1).
            kind="spot" if pool.kind == Pool.Kind.SPOT else "on_demand",
            rank=pool.rank,
            floor_gpus=pool.floor_gpus,
        )
        for pool in pools.values()
    ]
    if any(vm.pool == _OTHER_POOLS for vm in vms):
        lowest = max((pool.rank for pool in pools.values()), default=0)
        snapshot_pools.append(am.Pool(name=_OTHER_POOLS, kind="on_demand", rank=lowest + 1))
    return am.Snapshot(
        capacity_set=am.CapacitySet(
            name=f"cluster {fleet.cluster_id}: standalone {gpu_model} {fabric}",
            fabric=fabric,
            gpu_model=gpu_model,
        ),
        nodes=nodes.snapshot_nodes(),
        pools=tuple(snapshot_pools),
        vms=tuple(vms),
        demands=tuple(_demands(fleet, pools)),
        now=fleet.now,
    )


class _ClassNodes:
    """The standalone nodes of one hardware class, with their partition tables, the GPUs held
    on them, and the GPUs no placement may take and no preemption may free ("unusable": failed
    cards, and cards held in a way the snapshot cannot express)."""

    def __init__(self, fabric: str, nodes: dict[int, Node], failed: dict[int, set[int]]):
        self.nodes = nodes
        self.tables = {
            node_id: partition_table(self._arbiter_node(node), fabric)
            for node_id, node in nodes.items()
        }
        self.masks = {
            node_id: frozenset(gpu_mask(block) for block in table)
            for node_id, table in self.tables.items()
        }
        self.unusable = {node_id: set(failed.get(node_id, ())) for node_id in nodes}
        self.busy = {node_id: gpu_mask(self.unusable[node_id]) for node_id in nodes}

    @staticmethod
    def _arbiter_node(node: Node, failed: tuple[int, ...] = ()) -> am.Node:
        return am.Node(
            name=node.hostname,
            gpus=node.gpu_count,
            state=node.state,
            failed_gpus=failed,
            partitions=tuple(tuple(b) for b in node.partitions) if node.partitions else None,
        )

    def is_partition(self, node_id: int, gpus: list[int]) -> bool:
        return gpu_mask(gpus) in self.masks[node_id]

    def hold(self, node_id: int, gpus) -> None:
        self.busy[node_id] |= gpu_mask(gpus)

    def make_unusable(self, node_id: int, gpus) -> None:
        self.unusable[node_id].update(gpus)
        self.hold(node_id, gpus)

    def snapshot_nodes(self) -> tuple[am.Node, ...]:
        return tuple(
            self._arbiter_node(node, tuple(sorted(self.unusable[node_id])))
            for node_id, node in self.nodes.items()
        )


def _reservations(
    fleet: _StandaloneFleet, pools: dict[int, Pool], nodes: _ClassNodes
) -> list[am.Vm]:
    """Keep the whole block of a VM that waits for its victims, not only the victims' GPUs:
    when a victim held only part of the block, the free rest must not go to a lower-ranked
    request meanwhile. The rest enters the snapshot as VMs under notice (reserved, never
    victims), or as unusable GPUs when it is no union of the table's partitions."""
    reserved = []
    for vm in fleet.pending:
        if vm.pool_id not in pools or not vm.waits_for_victims:
            continue
        victims: dict[int, int] = defaultdict(int)  # node id -> mask of the victims' GPUs
        for victim_id in fleet.victims.get(vm.pk, ()):
            for node_id, gpus in fleet.held[victim_id].items():
                if node_id in nodes.nodes:
                    victims[node_id] |= gpu_mask(gpus)
        for node_id, theirs in sorted(victims.items()):
            blocks = [
                block
                for block in nodes.tables[node_id]
                if len(block) == vm.gpu_count
                and gpu_mask(block) & theirs
                and not gpu_mask(block) & nodes.busy[node_id] & ~theirs
            ]
            if not blocks or any(not gpu_mask(block) & ~theirs for block in blocks):
                continue  # the victims' GPUs (reserved already) make a whole block
            rest = [index for index in blocks[0] if not theirs & (1 << index)]
            pieces = _cover(rest, nodes.tables[node_id])
            if pieces is None:
                nodes.make_unusable(node_id, rest)
                continue
            nodes.hold(node_id, rest)
            reserved.extend(
                am.Vm(
                    id=f"{vm.instance_id}/reserved-{n}",
                    pool=_OTHER_POOLS,
                    node=nodes.nodes[node_id].hostname,
                    gpus=piece,
                    started_at=fleet.now,
                    state="notified",
                )
                for n, piece in enumerate(pieces, start=1)
            )
    return reserved


def _cover(gpus: list[int], table) -> list[tuple[int, ...]] | None:
    """Partitions of the table that together are exactly ``gpus`` (largest first), or None."""
    left = gpu_mask(gpus)
    pieces = []
    for block in sorted(table, key=len, reverse=True):
        mask = gpu_mask(block)
        if mask & left == mask:
            pieces.append(tuple(sorted(block)))
            left &= ~mask
    return pieces if not left else None


def _demands(fleet: _StandaloneFleet, pools: dict[int, Pool]):
    for vm in fleet.pending:
        if vm.pool_id not in pools:
            continue
        if vm.waits_for_victims:
            # Its victims are stopping and their GPUs are reserved for it: no second round of
            # victims. It is placed once they are off (vm_mark_stopped runs placement again).
            continue
        if gpu_count_problem(vm.pool.fabric, vm.gpu_count):
            continue  # vm_request refuses these; nothing here could place it
        yield am.Demand(
            id=vm.instance_id,
            group=vm.instance_id,
            pool=vm.pool.name,
            gpus=vm.gpu_count,
            requested_at=vm.requested_at,
        )


# --- plan -> services ----------------------------------------------------------------------------


def _apply(fleet: _StandaloneFleet, plan: am.Plan, result: PlacementResult) -> None:
    by_instance = {vm.instance_id: vm for vm in fleet.pending}
    by_instance.update({vm.instance_id: vm for vm in fleet.holders.values()})
    nodes = {node.hostname: node for node in fleet.nodes.values()}
    # GPUs that victims of this plan still hold: a placement on any of them must wait, even one
    # that preempts nobody itself (a victim's spare GPUs are free capacity for the plan's later
    # placements, but only once the victim is off).
    leaving: dict[str, set[int]] = defaultdict(set)
    for preemption in plan.preemptions:
        leaving[preemption.node].update(preemption.gpus)

    for preemption in plan.preemptions:
        victim, beneficiary = by_instance[preemption.vm], by_instance[preemption.for_demand]
        try:
            services.vm_preempt(vm=victim, for_vm=beneficiary)
        except Conflict as exc:  # it changed state since it was read (its owner stopped it)
            logger.info("%s was not preempted: %s", victim.instance_id, exc)
            continue
        logger.info("%s preempted without notice: %s", victim.instance_id, preemption.reason)
        result.preempted.append(
            Preempted(
                vm_id=victim.pk,
                for_vm_id=beneficiary.pk,
                node=preemption.node,
                gpus=preemption.gpus,
            )
        )

    for placement in plan.placements:
        vm = by_instance[placement.demand]
        if placement.preempts or leaving[placement.node] & set(placement.gpus):
            logger.info(
                "%s waits for %s to stop on %s",
                vm.instance_id,
                ", ".join(placement.preempts) or "preempted VMs",
                placement.node,
            )
            result.waiting.append(vm.pk)
            continue
        node = nodes[placement.node]
        try:
            services.vm_place(
                vm=vm,
                node=node,
                gpu_indices=placement.gpus,
                message=f"standalone placement on free GPUs {list(placement.gpus)} of "
                f"{node.hostname} (pool {vm.pool.name}, rank {vm.pool.rank})",
            )
        except (Conflict, ValidationError) as exc:
            # Someone else took the GPUs or changed the VM since it was read (a hand
            # placement, a terminate); the next run plans again from the new state.
            reason = exc.message if isinstance(exc, Conflict) else "; ".join(exc.messages)
            logger.info("%s was not placed: %s", vm.instance_id, reason)
            result.unsatisfied.append(Unplaced(vm_id=vm.pk, reason=reason))
            continue
        result.placed.append(Placed(vm_id=vm.pk, node=node.hostname, gpus=placement.gpus))

    for unsatisfied in plan.unsatisfied:
        vm = by_instance[unsatisfied.demand]
        logger.info("%s stays pending: %s", vm.instance_id, unsatisfied.reason)
        result.unsatisfied.append(Unplaced(vm_id=vm.pk, reason=unsatisfied.reason))

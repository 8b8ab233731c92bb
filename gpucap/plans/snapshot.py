"""The live fleet as the arbiter sees it: the database -> `gpucap.arbiter.model.Snapshot`.

One translation serves both places the arbiter plans:

- a capacity set (`capacity_set_snapshot`): the set's nodes and pools, with the pools' real
  kinds (inference replicas may be reclaimed down to their floors);
- the standalone nodes of a cluster, per hardware class (`gpucap.plans.standalone`): there
  on-demand and inference pools enter as ``on_demand``, so only spot VMs can be preempted.

What goes in:

- nodes with their partition tables, state and failed GPUs;
- pools with the rank and floor in force (the set's schedule or an override may put others in
  force than the pool's own: gpucap/schedules) and protection window (``protect_seconds``; a
  VM is protected from its latest start or resume: ``started_at``, or the snapshot's ``now``
  while it is provisioning);
- every VM holding GPUs on these nodes: ``running`` (provisioning or running) or ``notified``
  (under notice or stopping: leaving, its GPUs reserved, never a victim again). A VM of a pool
  outside the snapshot (placed by hand, or left when a node changed sets) enters under the
  pseudo-pool ``(other pools)``, ranked below every pool and never preempted. A VM holding GPUs
  that are not one partition of its node's table cannot be expressed; those GPUs are marked
  unusable (as if failed) and the VM is left alone;
- inference deployments of the pools with the ``min_replicas`` in force (no preemption takes
  one below it), and each replica VM naming its deployment;
- in a capacity set, each running or notified VM that is not an inference replica naming its
  job (``group``: the demand group it was requested in), so the arbiter reclaims a multi-VM
  job whole or not at all (outside a set, `standalone` stops a victim's job-mates itself);
- pending VMs as demands, one group each (the replicas of one inference scale-up step share
  theirs), each naming the node that still holds its disk, if any (``disk_node``: the arbiter
  prefers it when it fits as well), except VMs whose placement is under way: their GPUs are
  reserved for them instead, so they get no second round of victims and no second placement.
  A placement is under way while its victims are still leaving (their GPUs and the free rest
  of the block), and, in a capacity set, for as long as an applied plan's placement of the VM
  waits to be completed (the plan's block). A tick completes waiting placements before it
  plans, in a transaction of its own, so the last victim may go off between the two; the plan
  made then must neither place the VM a second time nor give its block to anyone else.

Loading is a fixed number of queries whatever the fleet's size (`LiveCapacity.load`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import Exists, JSONField, OuterRef, QuerySet, Subquery
from django.utils import timezone

from gpucap.allocation.selectors import set_quotas
from gpucap.arbiter import model as am
from gpucap.arbiter.topology import gpu_count_problem, gpu_mask, partition_table
from gpucap.fleet.models import CapacitySet, Gpu, Node, Pool
from gpucap.inference.models import InferenceDeployment
from gpucap.plans.models import PlanAction
from gpucap.plans.reservation_feed import in_force_rows, with_reservations
from gpucap.rentals.models import VirtualMachine
from gpucap.schedules.calendar import Policy

logger = logging.getLogger(__name__)

State = VirtualMachine.State

# What the arbiter sees of a VM's state: GPUs of a VM that is leaving are reserved, and such a VM
# is never chosen as a victim again.
SNAPSHOT_STATE = {
    State.PROVISIONING: "running",
    State.RUNNING: "running",
    State.NOTIFIED: "notified",
    State.STOPPING: "notified",
}
# VMs already on their way out for a placement: that placement waits for them.
IN_FLIGHT = (State.NOTIFIED, State.STOPPING)
# The snapshot pool standing for VMs on these nodes that belong to no pool of the snapshot.
OTHER_POOLS = "(other pools)"

Hardware = tuple[str, str]  # (GPU model, fabric)

# What is read of a VM holding GPUs: here, in the plan's lines (gpucap.plans.services.plan_actions)
# and on the pages that show them (the what-if's). Only these are loaded: all of a VM's fields,
# for thousands of VMs, cost most of a large set's snapshot. A field read but not listed here
# costs a query per VM that reads it: add it here.
HOLDER_FIELDS = (
    "id",
    "name",
    "role",
    "state",
    "gpu_count",
    "tenant_id",
    "pool_id",
    "node_id",
    "deployment_id",
    "preempted_for_id",
    "borrowed_from_id",  # the arbiter reclaims borrowers first when a reservation is claimed
    "reservation_id",  # ... and holds the VMs placed inside a reservation first
    "started_at",
    "demand_group",  # a running job's members are reclaimed together (_job)
    "tenant__name",
    "tenant__slug",
)


@dataclass
class LiveCapacity:
    """Nodes, pools, the VMs holding GPUs on the nodes and the pools' pending VMs, read once."""

    now: datetime
    pools: dict[int, Pool]
    nodes: dict[int, Node]
    failed: dict[int, set[int]]  # node id -> failed GPU indices
    holders: dict[int, VirtualMachine]  # VMs holding GPUs on these nodes
    held: dict[int, dict[int, list[int]]]  # VM id -> node id -> GPU indices
    victims: dict[int, list[int]]  # pending VM id -> ids of its victims still leaving
    # Annotated with ``waits_for_victims`` and the block of an applied plan's placement that
    # waits for it (``placement_node_id``, ``placement_gpus``; None when there is none).
    pending: list[VirtualMachine]
    deployments: dict[int, InferenceDeployment]  # of the pools

    @classmethod
    def load(cls, *, nodes: QuerySet[Node], pools: QuerySet[Pool]) -> LiveCapacity:
        """Six queries, whatever the number of nodes, GPUs, VMs and deployments.

        Which VM holds which GPUs, and the VMs themselves, come from ONE query (a statement
        sees one state of the database): read apart, a VM that let go of its GPUs between the
        two reads was a holder of GPUs with no VM to show for it. Between this and the other
        queries the set may still move; ``consistent_snapshot`` reads again when its generation
        did."""
        pools_by_id = {pool.pk: pool for pool in pools}
        # The dedicated tenant's slug is the node's "tenant" in the snapshot (a join, no query).
        nodes_by_id = {node.pk: node for node in nodes.select_related("dedicated_tenant")}
        failed: dict[int, set[int]] = defaultdict(set)
        for node_id, index in Gpu.objects.filter(
            node_id__in=nodes_by_id, health=Gpu.Health.FAILED
        ).values_list("node_id", "index"):
            failed[node_id].add(index)
        held: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        holders: dict[int, VirtualMachine] = {}
        # Each holder once (not once per GPU), with what the snapshot and the plan name, and
        # its live allocations' GPUs aggregated in the same statement.
        order = ("allocations__gpu__node_id", "allocations__gpu__index")
        live = (
            VirtualMachine.objects.filter(
                allocations__released_at=None, allocations__gpu__node_id__in=nodes_by_id
            )
            .annotate(
                held_nodes=ArrayAgg("allocations__gpu__node_id", order_by=order),
                held_indices=ArrayAgg("allocations__gpu__index", order_by=order),
            )
            .select_related("tenant")
            .only(*HOLDER_FIELDS)
            .order_by("pk")
        )
        pool_cache = VirtualMachine.pool.field
        for vm in live:
            if vm.pool_id in pools_by_id:  # the pools read above, not one instance per VM
                pool_cache.set_cached_value(vm, pools_by_id[vm.pool_id])
            for node_id, index in zip(vm.held_nodes, vm.held_indices, strict=True):
                held[vm.pk][node_id].append(index)
            holders[vm.pk] = vm
        in_flight = VirtualMachine.objects.filter(preempted_for=OuterRef("pk"), state__in=IN_FLIGHT)
        waiting = PlanAction.objects.filter(
            vm=OuterRef("pk"), kind=PlanAction.Kind.PLACEMENT, progress=PlanAction.Progress.WAITING
        ).order_by("pk")
        pending = list(
            VirtualMachine.objects.filter(state=State.PENDING, pool_id__in=pools_by_id)
            .annotate(
                waits_for_victims=Exists(in_flight),
                placement_node_id=Subquery(waiting.values("node_id")[:1]),
                placement_gpus=Subquery(waiting.values("gpus")[:1], output_field=JSONField()),
            )
            .select_related("pool", "tenant")
            .order_by("requested_at", "pk")
        )
        deployments = {
            deployment.pk: deployment
            for deployment in InferenceDeployment.objects.filter(pool_id__in=pools_by_id)
        }
        victims: dict[int, list[int]] = defaultdict(list)
        for vm in holders.values():
            if vm.preempted_for_id is not None and vm.state in IN_FLIGHT:
                victims[vm.preempted_for_id].append(vm.pk)
        return cls(
            now=timezone.now(),
            pools=pools_by_id,
            nodes=nodes_by_id,
            failed=failed,
            holders=holders,
            held=held,
            victims=victims,
            pending=pending,
            deployments=deployments,
        )

    def demand_classes(self) -> set[Hardware]:
        return {(vm.pool.gpu_model, vm.pool.fabric) for vm in self.pending}

    def vms_by_instance(self) -> dict[str, VirtualMachine]:
        """Every VM the snapshot names (pending and holding), by instance id."""
        found = {vm.instance_id: vm for vm in self.holders.values()}
        found.update({vm.instance_id: vm for vm in self.pending})
        return found

    def snapshot(
        self,
        hardware: Hardware,
        *,
        name: str,
        pool_kind: Callable[[Pool], str] = lambda pool: pool.kind,
        extra_demands: Iterable[am.Demand] = (),
        jobs: bool = False,
    ) -> am.Snapshot:
        """The arbiter's snapshot of this capacity's nodes and pools of one hardware class.
        ``pool_kind`` maps a pool to the kind the arbiter sees; ``extra_demands`` are added
        after the pending VMs (a what-if); ``jobs`` names each VM's running job (`_job_of`),
        so the arbiter reclaims multi-VM jobs whole (a capacity set: the standalone path stops
        a victim's job-mates itself, at once)."""
        gpu_model, fabric = hardware
        pools = {
            pool_id: pool
            for pool_id, pool in self.pools.items()
            if (pool.gpu_model, pool.fabric) == hardware
        }
        nodes = ClassNodes(
            fabric,
            {
                node_id: node
                for node_id, node in self.nodes.items()
                if (node.gpu_model, node.fabric) == hardware
            },
            self.failed,
        )
        vms = list(self._holding_vms(pools, nodes, pool_kind, jobs=jobs))
        vms.extend(self._reservations(pools, nodes))
        snapshot_pools = [
            am.Pool(
                name=pool.name,
                kind=pool_kind(pool),
                rank=pool.rank_in_force,
                floor_gpus=pool.floor_in_force,
                protect_seconds=pool.protect_seconds,
            )
            for pool in pools.values()
        ]
        if any(vm.pool == OTHER_POOLS for vm in vms):
            lowest = max((pool.rank_in_force for pool in pools.values()), default=0)
            snapshot_pools.append(am.Pool(name=OTHER_POOLS, kind="on_demand", rank=lowest + 1))
        return am.Snapshot(
            capacity_set=am.CapacitySet(name=name, fabric=fabric, gpu_model=gpu_model),
            nodes=nodes.snapshot_nodes(),
            pools=tuple(sorted(snapshot_pools, key=lambda pool: pool.rank)),
            vms=tuple(vms),
            demands=(*self._demands(pools, nodes), *extra_demands),
            deployments=tuple(
                am.Deployment(
                    name=deployment.slug,
                    pool=pools[deployment.pool_id].name,
                    min_replicas=deployment.min_replicas_in_force,
                )
                for deployment in sorted(self.deployments.values(), key=lambda d: d.slug)
                # Outside a set an inference pool enters as on_demand: no floors to keep.
                if deployment.pool_id in pools
                and pool_kind(pools[deployment.pool_id]) == "inference"
            ),
            now=self.now,
        )

    def _holding_vms(
        self,
        pools: dict[int, Pool],
        nodes: ClassNodes,
        pool_kind: Callable[[Pool], str],
        *,
        jobs: bool = False,
    ) -> Iterable[am.Vm]:
        for vm_id, by_node in sorted(self.held.items()):
            vm = self.holders[vm_id]
            here = {node_id: gpus for node_id, gpus in by_node.items() if node_id in nodes.nodes}
            if not here:
                continue
            node_id, gpus = next(iter(here.items()))
            if len(by_node) != 1 or not nodes.is_partition(node_id, gpus):
                # Placed by hand on GPUs that are not one partition of the table: leave it alone.
                logger.warning(
                    "%s holds GPUs %s that are not one partition of a node's table; the arbiter "
                    "leaves them alone",
                    vm.instance_id,
                    {self.nodes[n].hostname: sorted(g) for n, g in by_node.items()},
                )
                for other_node, other_gpus in here.items():
                    nodes.make_unusable(other_node, other_gpus)
                continue
            yield am.Vm(
                id=vm.instance_id,
                pool=pools[vm.pool_id].name if vm.pool_id in pools else OTHER_POOLS,
                node=nodes.nodes[node_id].hostname,
                gpus=tuple(sorted(gpus)),
                # A VM being provisioned is starting or resuming now (its started_at is still
                # the last run's): that is when its pool's protection window opens.
                started_at=(
                    vm.started_at if vm.started_at and vm.state != State.PROVISIONING else self.now
                ),
                state=SNAPSHOT_STATE[vm.state],
                tenant=vm.tenant.slug,
                deployment=self._deployment_of(vm, pools, pool_kind),
                group=_job_of(vm) if jobs else None,
            )
            nodes.hold(node_id, gpus)

    def _deployment_of(
        self, vm: VirtualMachine, pools: dict[int, Pool], pool_kind: Callable[[Pool], str]
    ) -> str | None:
        deployment = self.deployments.get(vm.deployment_id)
        if deployment is None or vm.pool_id not in pools:
            return None
        return deployment.slug if pool_kind(pools[vm.pool_id]) == "inference" else None

    def _reservations(self, pools: dict[int, Pool], nodes: ClassNodes) -> list[am.Vm]:
        """Keep the whole block of a VM whose placement is under way, not only its victims'
        GPUs: when a victim held only part of the block, or the victims are off already and the
        placement is not completed yet, the free GPUs must not go to anyone else meanwhile. They
        enter the snapshot as VMs under notice (reserved, never victims), or as unusable GPUs
        when they are no union of the table's partitions."""
        reserved = []
        for vm in self.pending:
            if vm.pool_id not in pools:
                continue
            if vm.placement_node_id is not None:
                # An applied plan gave it this block: it is placed there, or its placement is
                # marked missed and it is a demand again (`placements_complete`).
                if vm.placement_node_id in nodes.nodes:
                    reserved.extend(
                        self._reserve(vm, nodes, vm.placement_node_id, vm.placement_gpus)
                    )
                continue
            if not vm.waits_for_victims:
                continue
            victims: dict[int, int] = defaultdict(int)  # node id -> mask of the victims' GPUs
            for victim_id in self.victims.get(vm.pk, ()):
                for node_id, gpus in self.held[victim_id].items():
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
                reserved.extend(self._reserve(vm, nodes, node_id, blocks[0]))
        return reserved

    def _reserve(self, vm: VirtualMachine, nodes: ClassNodes, node_id: int, block) -> list[am.Vm]:
        """Reserve for ``vm`` the GPUs of ``block`` that nobody holds (its victims' GPUs are
        reserved already: a leaving VM's GPUs are never given to anyone else)."""
        rest = [index for index in block if not nodes.busy[node_id] & (1 << index)]
        if not rest:
            return []
        pieces = _cover(rest, nodes.tables[node_id])
        if pieces is None:
            nodes.make_unusable(node_id, rest)
            return []
        nodes.hold(node_id, rest)
        return [
            am.Vm(
                id=f"{vm.instance_id}/reserved-{n}",
                pool=OTHER_POOLS,
                node=nodes.nodes[node_id].hostname,
                gpus=piece,
                started_at=self.now,
                state="notified",
            )
            for n, piece in enumerate(pieces, start=1)
        ]

    def _demands(self, pools: dict[int, Pool], nodes: ClassNodes) -> Iterable[am.Demand]:
        for vm in self.pending:
            if vm.pool_id not in pools:
                continue
            if vm.waits_for_victims or vm.placement_node_id is not None:
                # Its placement is under way and its GPUs are reserved for it: no second round
                # of victims, no second placement. It is placed once its victims are off (or
                # planned again once its placement is missed).
                continue
            if gpu_count_problem(vm.pool.fabric, vm.gpu_count):
                continue  # vm_request refuses these; nothing here could place it
            yield am.Demand(
                id=vm.instance_id,
                # The replicas of one inference scale-up step are placed together or not at all.
                group=vm.demand_group or vm.instance_id,
                pool=vm.pool.name,
                gpus=vm.gpu_count,
                requested_at=vm.requested_at,
                # Whose quotas it counts against and whose dedicated nodes it may use.
                tenant=vm.tenant.slug,
                # Where its disk waits (a reclaimed spot VM): placement prefers that node.
                disk_node=(
                    nodes.nodes[vm.disk_node_id].hostname
                    if vm.disk_node_id in nodes.nodes
                    else None
                ),
            )


class ClassNodes:
    """The nodes of one hardware class, with their partition tables, the GPUs held on them, and
    the GPUs no placement may take and no preemption may free ("unusable": failed cards, and
    cards held in a way the snapshot cannot express)."""

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
            # Dedicated: only that tenant's demands are placed there (docs/allocation.md).
            tenant=node.dedicated_tenant.slug if node.dedicated_tenant_id else None,
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
            for node_id, node in sorted(self.nodes.items(), key=lambda item: item[1].hostname)
        )


def _job_of(vm: VirtualMachine) -> str | None:
    """The running job a VM belongs to: the demand group it was requested in, kept after it
    starts, so the arbiter reclaims the job whole. Inference replicas of one scale-up step
    share a group too, but run independently once started: they carry none."""
    if vm.deployment_id is not None or not vm.demand_group:
        return None
    return vm.demand_group


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


# --- a capacity set ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SetSnapshot:
    """A capacity set's snapshot with what is needed to act on its plan: the generation it was
    read at (read first, so any change committed while reading makes it stale) and the VMs and
    nodes it names."""

    capacity_set: CapacitySet
    generation: int
    snapshot: am.Snapshot
    live: LiveCapacity

    @property
    def vms(self) -> dict[str, VirtualMachine]:
        return self.live.vms_by_instance()

    @property
    def nodes(self) -> dict[str, Node]:
        return {node.hostname: node for node in self.live.nodes.values()}


def capacity_set_snapshot(
    capacity_set: CapacitySet, *, extra_demands: Iterable[am.Demand] = ()
) -> SetSnapshot:
    """The set as the arbiter sees it now, with the quotas that bind its tenants and the
    reservations in force. Nine or ten queries, whatever the set's size."""
    generation = CapacitySet.objects.filter(pk=capacity_set.pk).values_list(
        "generation", flat=True
    )[0]
    live = LiveCapacity.load(
        nodes=Node.objects.filter(capacity_set=capacity_set).order_by("hostname"),
        pools=Pool.objects.filter(capacity_set=capacity_set).order_by("rank"),
    )
    snapshot = live.snapshot(
        (capacity_set.gpu_model, capacity_set.fabric),
        name=capacity_set.name,
        extra_demands=extra_demands,
        jobs=True,
    )
    snapshot = replace(
        snapshot, quotas=set_quotas(capacity_set=capacity_set, pools=list(live.pools.values()))
    )
    snapshot = with_reservations(
        snapshot, in_force_rows(capacity_set, snapshot), live.holders.values()
    )
    return SetSnapshot(
        capacity_set=capacity_set, generation=generation, snapshot=snapshot, live=live
    )


# The demands `with_policy` adds for the replicas a raised minimum would ask for are named
# ``scheduled-<deployment>-<n>``, one group per deployment (as the replicas of one scale-up step).
SCHEDULED_PREFIX = "scheduled-"
# A replica that counts toward a deployment's range (gpucap.inference.services.LIVE).
_COUNTED = (State.PENDING, State.PROVISIONING, State.RUNNING)


def with_policy(snap: SetSnapshot, policy: Policy, at: datetime) -> SetSnapshot:
    """The set as the arbiter would see it at ``at`` with ``policy`` in force, on today's
    fleet: the pools' ranks and floors and the deployments' minimums are the policy's, each
    deployment whose replicas (pending, provisioning, running) fall short of its minimum asks
    for the rest (one demand per replica, ``gpus_per_replica`` each, one group per deployment,
    queued after the pending VMs, as the autoscaler would), and ``now`` is ``at``. Nothing is
    read from the database: the snapshot is built from ``snap`` alone."""
    live, snapshot = snap.live, snap.snapshot
    pools = tuple(
        sorted(
            (
                replace(
                    pool,
                    rank=policy.ranks.get(pool.name, pool.rank),
                    floor_gpus=policy.floors.get(pool.name, pool.floor_gpus),
                )
                for pool in snapshot.pools
            ),
            key=lambda pool: pool.rank,
        )
    )
    deployments = tuple(
        replace(d, min_replicas=policy.replicas.get(d.name, (d.min_replicas, 0))[0])
        for d in snapshot.deployments
    )
    counted: dict[int, int] = defaultdict(int)
    for vm in (*live.holders.values(), *live.pending):
        if vm.deployment_id is not None and vm.state in _COUNTED:
            counted[vm.deployment_id] += 1
    in_snapshot = {d.name for d in snapshot.deployments}
    extra = []
    for deployment in sorted(live.deployments.values(), key=lambda d: d.slug):
        if deployment.slug not in in_snapshot:
            continue  # not an inference pool of this snapshot
        wanted = policy.replicas.get(deployment.slug, (deployment.min_replicas_in_force, 0))[0]
        group = f"{SCHEDULED_PREFIX}{deployment.slug}"
        for n in range(1, wanted - counted[deployment.pk] + 1):
            extra.append(
                am.Demand(
                    id=f"{group}-{n}",
                    group=group,
                    pool=live.pools[deployment.pool_id].name,
                    gpus=deployment.gpus_per_replica,
                    requested_at=at + timedelta(microseconds=n),
                )
            )
    return replace(
        snap,
        snapshot=replace(
            snapshot,
            pools=pools,
            deployments=deployments,
            demands=(*snapshot.demands, *extra),
            now=at,
        ),
    )

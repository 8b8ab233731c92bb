"""The simulated set: who holds which GPU, the VMs running and under notice, the demands
waiting, and the arbiter's snapshot of it all at a step.

A placement on GPUs that are free starts at once. One that needs GPUs still held (its victims',
under notice) waits: it reserves the free rest of its partition, and starts once every GPU of
the partition is free. In the arbiter's snapshot the reserved GPUs are VMs under notice of the
pseudo-pool `RESERVED_POOL`, as the live snapshot shows a placement under way
(gpucap.plans.snapshot): never given to anyone else, never reclaimed, counted in no pool.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from gpucap.arbiter.model import Demand, Deployment, Plan, Pool, Reservation, Snapshot, Vm
from gpucap.arbiter.topology import gpu_mask, partition_table
from gpucap.schedules.calendar import Policy
from gpucap.simulation.result import Event
from gpucap.simulation.spec import DeploymentSpec

RESERVED_POOL = "(reserved)"


class SimVm:
    """A VM of the simulation (mutable; `frozen` is its arbiter form, rebuilt on change)."""

    __slots__ = (
        "deadline",
        "deployment",
        "ends_at",
        "frozen",
        "gpus",
        "group",
        "id",
        "node",
        "pool",
        "ready_at",
        "started_at",
        "state",
        "tenant",
    )

    def __init__(self, vm: Vm, *, ready_at: datetime, ends_at: datetime | None) -> None:
        self.id, self.pool, self.node, self.gpus = vm.id, vm.pool, vm.node, vm.gpus
        self.started_at, self.deployment, self.tenant = vm.started_at, vm.deployment, vm.tenant
        self.group, self.state = vm.group, vm.state
        self.ready_at, self.ends_at = ready_at, ends_at
        self.deadline: datetime | None = None
        self.frozen = vm


class SimDemand:
    """A VM asked for and not running yet: a replica, an arrival, a resume or the start's."""

    __slots__ = ("deployment", "duration", "frozen", "job", "kind", "tenant")

    def __init__(
        self,
        demand: Demand,
        *,
        kind: str,
        deployment: str | None = None,
        duration: timedelta | None = None,
        tenant: str | None = None,
        job: str | None = None,
    ) -> None:
        self.frozen = demand
        self.kind = kind  # "replica", "arrival", "resume" or "start"
        self.job = job  # a resuming VM's job (its group while it ran)
        self.deployment = deployment
        self.duration = duration
        self.tenant = tenant


class Fleet:
    """The set as it stands during a simulation (mutable; the arbiter sees `snapshot`)."""

    def __init__(
        self,
        start: Snapshot,
        *,
        deployments: Mapping[str, DeploymentSpec],
        notice: timedelta,
        startup: timedelta,
    ) -> None:
        self.start = start
        self.notice, self.startup = notice, startup
        self.pool_kind = {pool.name: pool.kind for pool in start.pools}
        fabric = start.capacity_set.fabric
        self.tables = {node.name: partition_table(node, fabric) for node in start.nodes}
        self.holder: dict[str, list[str | None]] = {
            node.name: [None] * node.gpus for node in start.nodes
        }
        self.vms: dict[str, SimVm] = {}
        self.replicas: dict[str, dict[str, SimVm]] = {slug: {} for slug in deployments}
        self.held = {pool.name: 0 for pool in start.pools}
        self.pending: dict[str, SimDemand] = {}
        self.waiting: dict[str, tuple[SimDemand, str, tuple[int, ...]]] = {}
        self.deadlines: list[tuple[datetime, str]] = []
        self.ends: list[tuple[datetime, str]] = []
        self.events: list[Event] = []
        self.resumes = 0  # reclaimed VMs running again, counted until the caller resets it
        # VM or demand id -> the reservation it borrows, as the last plan reported it (the live
        # set writes the same flags after each plan: gpucap.plans.reservation_feed).
        self.borrowing: dict[str, str] = {
            vm.id: vm.borrowed for vm in start.vms if vm.borrowed is not None
        }
        for vm in start.vms:
            self._add(SimVm(vm, ready_at=vm.started_at, ends_at=None))
            if vm.state == "notified":
                self._leave_at(self.vms[vm.id], start.now + notice)  # type: ignore[operator]
        for demand in start.demands:
            self.pending[demand.id] = SimDemand(demand, kind="start", tenant=demand.tenant)

    def asking(self) -> list[SimDemand]:
        """Every VM asked for and not running: pending, or placed and waiting for GPUs."""
        return [*self.pending.values(), *(demand for demand, _, _ in self.waiting.values())]

    def _add(self, vm: SimVm) -> None:
        self.vms[vm.id] = vm
        if vm.deployment in self.replicas:
            self.replicas[vm.deployment][vm.id] = vm
        holders = self.holder[vm.node]
        for index in vm.gpus:
            holders[index] = vm.id
        if vm.state == "running":
            self.held[vm.pool] = self.held.get(vm.pool, 0) + len(vm.gpus)
        if vm.ends_at is not None:
            heapq.heappush(self.ends, (vm.ends_at, vm.id))

    def _remove(self, vm: SimVm) -> None:
        del self.vms[vm.id]
        self.borrowing.pop(vm.id, None)
        if vm.deployment in self.replicas:
            del self.replicas[vm.deployment][vm.id]
        holders = self.holder[vm.node]
        for index in vm.gpus:
            if holders[index] == vm.id:
                holders[index] = None
        if vm.state == "running":
            self.held[vm.pool] -= len(vm.gpus)

    def _leave_at(self, vm: SimVm, deadline: datetime) -> None:
        if vm.state == "running":
            self.held[vm.pool] -= len(vm.gpus)
        vm.state = "notified"
        vm.deadline = deadline
        vm.frozen = replace(vm.frozen, state="notified")
        heapq.heappush(self.deadlines, (deadline, vm.id))

    def leave(self, now: datetime) -> bool:
        """VMs whose notice or duration is over leave; waiting placements then start if their
        GPUs are free. True when any GPU was freed."""
        freed = False
        while self.deadlines and self.deadlines[0][0] <= now:
            deadline, vm_id = heapq.heappop(self.deadlines)
            vm = self.vms.get(vm_id)
            if vm is None or vm.deadline != deadline:
                continue  # ended before its deadline
            self._remove(vm)
            freed = True
            self.events.append(Event(now, "off", vm.pool, vm.id, vm.node, vm.tenant))
            if vm.deployment is None and self.pool_kind.get(vm.pool) != "on_demand":
                self._pending_resume(vm, deadline)
        while self.ends and self.ends[0][0] <= now:
            ends_at, vm_id = heapq.heappop(self.ends)
            vm = self.vms.get(vm_id)
            if vm is None or vm.ends_at != ends_at:
                continue
            self._remove(vm)
            freed = True
            self.events.append(Event(now, "end", vm.pool, vm.id, vm.node, vm.tenant))
        if freed:
            for demand_id, (demand, node, gpus) in list(self.waiting.items()):
                holders = self.holder[node]
                mine = f"~{demand_id}"
                if all(holders[index] in (None, mine) for index in gpus):
                    del self.waiting[demand_id]
                    self.start_vm(demand, node, gpus, now)
        return freed

    def _pending_resume(self, vm: SimVm, since: datetime) -> None:
        """A reclaimed spot VM waits to run again, near its disk, for the rest of its run."""
        left = None if vm.ends_at is None else max(vm.ends_at - since, timedelta(0))
        demand = Demand(
            id=vm.id,
            group=vm.group or vm.id,
            pool=vm.pool,
            gpus=len(vm.gpus),
            requested_at=since,
            disk_node=vm.node,
            tenant=vm.tenant,
        )
        self.pending[vm.id] = SimDemand(
            demand, kind="resume", duration=left, tenant=vm.tenant, job=vm.group
        )

    def start_vm(self, demand: SimDemand, node: str, gpus: tuple[int, ...], now: datetime) -> None:
        frozen = demand.frozen
        holders = self.holder[node]
        for index in gpus:
            holders[index] = None
        vm = Vm(
            id=frozen.id,
            pool=frozen.pool,
            node=node,
            gpus=gpus,
            started_at=now,
            deployment=demand.deployment,
            tenant=demand.tenant,
            group=demand.job,
            borrowed=self.borrowing.get(frozen.id),
        )
        ends_at = now + demand.duration if demand.duration is not None else None
        self._add(SimVm(vm, ready_at=now + self.startup, ends_at=ends_at))
        if demand.kind == "resume":
            self.resumes += 1
            self.events.append(Event(now, "resume", vm.pool, vm.id, node, vm.tenant))

    def release(self, slug: str, count: int) -> None:
        """Scale down by ``count``: pending replicas first, then those waiting for GPUs, then
        the most recently started (terminated at once)."""
        asked = [d.frozen.id for d in self.pending.values() if d.deployment == slug]
        for demand_id in reversed(asked[-count:] if count else []):
            del self.pending[demand_id]
            count -= 1
        placing = [key for key, (d, _, _) in self.waiting.items() if d.deployment == slug]
        for demand_id in reversed(placing[-count:] if count > 0 else []):
            _, node, gpus = self.waiting.pop(demand_id)
            holders = self.holder[node]
            for gpu in gpus:
                if holders[gpu] == f"~{demand_id}":
                    holders[gpu] = None
            count -= 1
        if count <= 0:
            return
        running = sorted(
            (vm for vm in self.replicas[slug].values() if vm.state == "running"),
            key=lambda vm: (vm.started_at, vm.id),
        )
        for vm in running[-count:]:
            self._remove(vm)

    def snapshot(
        self,
        now: datetime,
        policy: Policy,
        deployments: Mapping[str, DeploymentSpec],
        reservations: tuple[Reservation, ...] = (),
    ) -> Snapshot:
        """The arbiter's view at ``now`` with ``policy`` and ``reservations`` in force, under
        the start's quotas."""
        vms = [vm.frozen for vm in self.vms.values()]
        failed: dict[str, list[int]] = {}
        for demand_id, (_, node, gpus) in self.waiting.items():
            mine = f"~{demand_id}"
            rest = [index for index in gpus if self.holder[node][index] == mine]
            pieces = _cover(rest, self.tables[node])
            if pieces is None:
                failed.setdefault(node, []).extend(rest)
                continue
            vms += [
                Vm(
                    id=f"{demand_id}/reserved-{number}",
                    pool=RESERVED_POOL,
                    node=node,
                    gpus=piece,
                    started_at=now,
                    state="notified",
                )
                for number, piece in enumerate(pieces, start=1)
            ]
        pools = [
            replace(pool, rank=policy.ranks[pool.name], floor_gpus=policy.floors[pool.name])
            for pool in self.start.pools
        ]
        if any(vm.pool == RESERVED_POOL for vm in vms):
            lowest = max(pool.rank for pool in pools)
            pools.append(Pool(name=RESERVED_POOL, kind="on_demand", rank=lowest + 1))
        nodes = self.start.nodes
        if failed:
            nodes = tuple(
                replace(node, failed_gpus=tuple(sorted({*node.failed_gpus, *failed[node.name]})))
                if node.name in failed
                else node
                for node in nodes
            )
        deployments_ = [
            Deployment(name=slug, pool=spec.pool, min_replicas=policy.replicas[slug][0])
            for slug, spec in deployments.items()
        ]
        deployments_ += [d for d in self.start.deployments if d.name not in deployments]
        return Snapshot(
            capacity_set=self.start.capacity_set,
            nodes=nodes,
            pools=tuple(sorted(pools, key=lambda pool: pool.rank)),
            vms=tuple(vms),
            demands=tuple(demand.frozen for demand in self.pending.values()),
            deployments=tuple(deployments_),
            now=now,
            quotas=self.start.quotas,
            reservations=reservations,
        )

    def borrowing_set(self, borrowing: dict[str, str]) -> bool:
        """The borrowers' flags become ``borrowing``: the running VMs whose flag changes get
        it, a demand listed gets it once it starts. True when a flag changed."""
        if borrowing == self.borrowing:
            return False
        for key in self.borrowing.keys() | borrowing.keys():
            vm = self.vms.get(key)
            wanted = borrowing.get(key)
            if vm is not None and vm.frozen.borrowed != wanted:
                vm.frozen = replace(vm.frozen, borrowed=wanted)
        self.borrowing = borrowing
        return True

    def apply(self, made: Plan, now: datetime) -> bool:
        """Act on ``made``: notices, placements, and the borrowers' flags its reports give.
        True when a flag changed (the next plan sees a different set)."""
        flagged = False
        if made.reservations or self.borrowing:
            flagged = self.borrowing_set(
                {key: report.id for report in made.reservations for key in report.borrowed}
            )
        deadline = now + self.notice
        for preemption in made.preemptions:
            vm = self.vms[preemption.vm]
            self._leave_at(vm, deadline)
            self.events.append(
                Event(now, "notice", vm.pool, vm.id, vm.node, vm.tenant, reason=preemption.reason)
            )
        if made.preemptions and not self.notice:
            self.leave(now)
        for placement in made.placements:
            demand = self.pending.pop(placement.demand)
            holders = self.holder[placement.node]
            if all(holders[index] is None for index in placement.gpus):
                self.start_vm(demand, placement.node, placement.gpus, now)
                continue
            mine = f"~{placement.demand}"
            for index in placement.gpus:
                if holders[index] is None:
                    holders[index] = mine
            self.waiting[placement.demand] = (demand, placement.node, placement.gpus)
        return flagged


def _cover(gpus: list[int], table: Iterable[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
    """Partitions of the table that together are exactly ``gpus`` (largest first), or None."""
    left = gpu_mask(gpus)
    pieces = []
    for block in sorted(table, key=len, reverse=True):
        mask = gpu_mask(block)
        if mask & left == mask:
            pieces.append(tuple(sorted(block)))
            left &= ~mask
    return pieces if not left else None

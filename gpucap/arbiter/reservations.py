"""Tenant reservations in the pure core (issue 19): claims, kept capacity and borrowing.

The rules are in model.py's docstring and docs/arbiter.md ("Reservations"). They are planned
by the unchanged planner, run in passes on snapshots derived from the real one (`_Fleet`), so
every rule it keeps (ranks, floors, protection, whole jobs, quotas, dedicated nodes) holds in
each pass; `planner.plan` comes here only when the snapshot has reservations.

1. Claims, one pass per reservation with claims (in the order of service of its first claim):
   the tenant's claim groups, with the VMs borrowing from its reservation moved to a pool
   ranked below every other (so they are legal victims whatever their rank, and the cheapest:
   reclaimed first), and the blocks kept for the other reservations held by placeholders.
2. Keeping: ceil(U / block_gpus) blocks per reservation are placed, as demands of a pool ranked
   lowest (free capacity only, best fit), on the state the claims left.
3. Ordinary: every other group, with the kept blocks held by placeholders (VMs under notice:
   no one takes or reclaims them).
4. Borrowing: groups of spot pools the ordinary pass left waiting, with the placeholders of
   other tenants' reservations removed; a placement on a kept block is marked ``borrowed``.

In every pass the VMs held inside the reservations (held.py: what each tenant uses, up to N)
are spared: no demand reclaims them. A pass's waits that only they cause say so.

Between passes, placements become VMs under notice (fixed for the rest of the plan, counted by
quotas, not by floors, as within one planner run) and victims leave their GPUs; they stay, under
notice on a node of their own that is down, so that their tenant's quotas still count them.
Finally each reservation's report is made, with a hypothetical claim of its unused part on the
fleet as the plan leaves it (`claims.py`, whose ``plan_reserved`` runs it all).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Protocol

from gpucap.arbiter.held import held_vms, held_waits
from gpucap.arbiter.merged import merged_plan
from gpucap.arbiter.model import (
    Demand,
    Node,
    Placement,
    Plan,
    Pool,
    Preemption,
    Reservation,
    Snapshot,
    Unsatisfied,
    Vm,
)
from gpucap.arbiter.topology import partition_table

__all__ = ["Block", "Fleet", "Passes", "Planner", "borrowing", "service_order", "valid_borrowers"]


class Planner(Protocol):
    """`planner.plan` as the passes call it: a snapshot without reservations, and the VMs no
    demand may reclaim (``held``)."""

    def __call__(self, snapshot: Snapshot, *, held: frozenset[str] = ...) -> Plan: ...


Block = tuple[str, tuple[int, ...]]  # (node, GPUs)
KEEP_POOL = "~keep"
BORROWED_POOL = "~borrowed"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def service_order(demands: Iterable[Demand], pools: Iterable[Pool]) -> list[list[Demand]]:
    """Demand groups in the planner's order of service (rule 8)."""
    rank = {pool.name: pool.rank for pool in pools}
    groups: dict[str, list[Demand]] = {}
    for demand in demands:
        groups.setdefault(demand.group, []).append(demand)
    return sorted(
        groups.values(),
        key=lambda g: (min(rank[d.pool] for d in g), min(d.requested_at for d in g), g[0].group),
    )


def valid_borrowers(snapshot: Snapshot) -> dict[str, str]:
    """VM id -> reservation, for the running spot VMs of other tenants flagged ``borrowed``
    with the id of a reservation in force (any other flag means not borrowing)."""
    return borrowing(snapshot.reservations, snapshot.pools, snapshot.vms)


def borrowing(
    reservations: Iterable[Reservation], pools: Iterable[Pool], vms: Iterable[Vm]
) -> dict[str, str]:
    """`valid_borrowers` among ``vms``."""
    owners = {r.id: r.tenant for r in reservations}
    kinds = {pool.name: pool.kind for pool in pools}
    return {
        vm.id: vm.borrowed
        for vm in vms
        if vm.borrowed in owners
        and vm.state == "running"
        and kinds.get(vm.pool) == "spot"
        and vm.tenant != owners[vm.borrowed]
    }


def held(snapshot: Snapshot, tenant: str) -> int:
    """GPUs of the tenant's running VMs in the set."""
    return sum(len(vm.gpus) for vm in snapshot.vms if vm.tenant == tenant and vm.state == "running")


def blocks_wanted(reservation: Reservation, holding: int) -> int:
    """How many blocks are kept for the reservation while its tenant holds ``holding`` GPUs
    (a block only partly needed is kept whole)."""
    return math.ceil(max(0, reservation.gpus - holding) / reservation.block_gpus)


class Fleet:
    """The set as the plan's passes leave it, and the snapshots the next pass plans."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.base = snapshot
        self.vms: dict[str, Vm] = {vm.id: vm for vm in snapshot.vms}
        self.gone: list[Vm] = []  # preempted: under notice until they leave
        self.demands = {demand.id: demand for demand in snapshot.demands}
        self._held_gpus: dict[str, set[int]] | None = None  # node -> GPUs held, once asked

    def apply(self, plan: Plan, demands: dict[str, Demand], *, state: str = "notified") -> None:
        """The plan's placements become VMs (``state``: under notice, fixed for the rest of the
        plan; running, to plan what comes after it) and its victims leave."""
        now = self.base.now
        self._held_gpus = None
        jobs: dict[str, int] = {}
        for placement in plan.placements:
            group = demands[placement.demand].group
            jobs[group] = jobs.get(group, 0) + 1
        for placement in plan.placements:
            demand = demands[placement.demand]
            self.vms[demand.id] = Vm(
                id=demand.id,
                pool=demand.pool,
                node=placement.node,
                gpus=placement.gpus,
                started_at=now or demand.requested_at,
                state=state,
                tenant=demand.tenant,
                group=demand.group if state == "running" and jobs[demand.group] > 1 else None,
                borrowed=placement.borrowed,
                reservation=placement.reservation,
            )
        for preemption in plan.preemptions:
            self.gone.append(self.vms.pop(preemption.vm))

    def snapshot_for(
        self,
        demands: Iterable[Demand],
        *,
        held_back: Iterable[tuple[str, Block]] = (),
        borrowers: Iterable[str] = (),
        pools: Iterable[Pool] = (),
    ) -> Snapshot:
        """The fleet now with these demands; ``held_back`` blocks (reservation, block) held by
        placeholders under notice; ``borrowers`` moved to the pool `BORROWED_POOL`."""
        base = self.base
        moved = set(borrowers)
        vms = [
            replace(vm, pool=BORROWED_POOL, deployment=None) if vm.id in moved else vm
            for vm in self.vms.values()
        ]
        nodes = list(base.nodes)
        for vm in self.gone:
            ghost = f"~left/{vm.id}"
            nodes.append(Node(ghost, 0, "down"))
            vms.append(replace(vm, node=ghost, state="notified", group=None, deployment=None))
        moment = base.now or EPOCH
        for number, (reservation, (node, gpus)) in enumerate(held_back):
            vms.append(
                Vm(
                    id=f"~kept/{reservation}/{number}",
                    pool=base.pools[0].name,
                    node=node,
                    gpus=gpus,
                    started_at=moment,
                    state="notified",
                )
            )
        return replace(
            base,
            nodes=tuple(nodes),
            pools=base.pools + tuple(pools),
            vms=tuple(vms),
            demands=tuple(demands),
            reservations=(),
        )

    def busy(self, node: Node) -> set[int]:
        """The node's GPUs that are failed or held by a VM of the fleet now."""
        if self._held_gpus is None:
            self._held_gpus = {}
            for vm in self.vms.values():
                self._held_gpus.setdefault(vm.node, set()).update(vm.gpus)
        return self._held_gpus.get(node.name, set()) | set(node.failed_gpus)

    def lowest_pool(self, name: str) -> Pool:
        """A spot pool ranked below every pool of the set, without floor or protection."""
        return Pool(name, "spot", max(pool.rank for pool in self.base.pools) + 1)


class Passes:
    """The passes of module docs, and what they leave for the reports (`run` the merged
    plan; then ``kept``, ``claim_blocks`` and ``borrowers`` for `claims.reports`)."""

    def __init__(self, snapshot: Snapshot, plan_one: Planner) -> None:
        self.snapshot = snapshot
        self.plan_one = plan_one
        self.fleet = Fleet(snapshot)
        self.owner = {r.id: r for r in snapshot.reservations}
        self.borrowers = valid_borrowers(snapshot)
        # What each tenant uses, held inside its reservation: spared in every pass (held.py).
        self.held = held_vms(snapshot.reservations, snapshot.vms, self.borrowers)
        self.spared = frozenset(self.held)
        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.unsatisfied: dict[str, Unsatisfied] = {}
        self.kept: dict[str, list[Block]] = {}
        self.claim_blocks: dict[str, list[Block]] = {}

    def run(self) -> Plan:
        order = service_order(self.snapshot.demands, self.snapshot.pools)
        claims = self._claims(order)
        if claims:
            self._serve_claims(claims)
        wanted = {
            r.id: blocks_wanted(r, self._holding(r.tenant) + self._lent(r.id))
            for r in self.snapshot.reservations
        }
        self.kept = self._keep(wanted)
        held_back = [(rid, block) for rid, blocks in self.kept.items() for block in blocks]
        claimed = {demand for groups in claims.values() for group in groups for demand in group}
        ordinary = [d for g in order for d in g if d not in claimed]
        self._pass(ordinary, held_back=held_back)
        self._borrow(order)
        return self._merged()

    # -- the passes ------------------------------------------------------------------------

    def _claims(self, order: list[list[Demand]]) -> dict[str, list[list[Demand]]]:
        """Per reservation with claims, its claim groups: the tenant's groups, in the order of
        service, that fit in what is left of its unused part (first fit)."""
        claims: dict[str, list[list[Demand]]] = {}
        left = {
            r.tenant: (r.id, max(0, r.gpus - held(self.snapshot, r.tenant)))
            for r in self.snapshot.reservations
        }
        for group in order:
            tenant = group[0].tenant
            if tenant not in left:
                continue
            rid, room = left[tenant]
            gpus = sum(demand.gpus for demand in group)
            if gpus <= room:
                claims.setdefault(rid, []).append(group)
                left[tenant] = (rid, room - gpus)
        return claims

    def _serve_claims(self, claims: dict[str, list[list[Demand]]]) -> None:
        reservations = self.snapshot.reservations
        others = len(reservations) > 1
        if others:
            wanted = {
                r.id: blocks_wanted(r, held(self.snapshot, r.tenant) + self._lent(r.id))
                for r in reservations
            }
            self.claim_blocks = self._keep(wanted)
        for rid, groups in claims.items():
            held_back = [
                (other, block)
                for other, blocks in self.claim_blocks.items()
                if other != rid
                for block in blocks
            ]
            borrowers = [
                vm for vm, of in self.borrowers.items() if of == rid and vm in self.fleet.vms
            ]
            self._pass(
                [demand for group in groups for demand in group],
                held_back=held_back,
                borrowers=borrowers,
                pools=[self.fleet.lowest_pool(BORROWED_POOL)] if borrowers else [],
                reservation=rid,
            )

    def _keep(self, wanted: dict[str, int]) -> dict[str, list[Block]]:
        """Place the wanted blocks on free capacity only (a lowest-ranked pool reclaims from
        no one), largest blocks first, the reservations' blocks in turn."""
        demands = []
        owner: dict[str, str] = {}
        moment = self.snapshot.now or EPOCH
        for position, r in enumerate(self.snapshot.reservations):
            for number in range(wanted.get(r.id, 0)):
                owner[f"~keep/{r.id}/{number}"] = r.id
                demands.append(
                    Demand(
                        id=f"~keep/{r.id}/{number}",
                        group=f"~keep/{8 - r.block_gpus}/{number:05d}/{position:05d}",
                        pool=KEEP_POOL,
                        gpus=r.block_gpus,
                        requested_at=moment,
                    )
                )
        if not demands:
            return {}
        snapshot = self.fleet.snapshot_for(demands, pools=[self.fleet.lowest_pool(KEEP_POOL)])
        kept: dict[str, list[Block]] = {}
        for placement in self.plan_one(snapshot).placements:
            kept.setdefault(owner[placement.demand], []).append((placement.node, placement.gpus))
        return kept

    def _pass(
        self,
        demands: list[Demand],
        *,
        held_back: list[tuple[str, Block]],
        borrowers: Iterable[str] = (),
        pools: Iterable[Pool] = (),
        reservation: str | None = None,
        borrowing: bool = False,
    ) -> None:
        if not demands:
            return
        borrowers, pools = list(borrowers), list(pools)
        snapshot = self.fleet.snapshot_for(
            demands, held_back=held_back, borrowers=borrowers, pools=pools
        )
        result = self.plan_one(snapshot, held=self.spared)
        by_id = {demand.id: demand for demand in demands}
        placements = []
        for placement in result.placements:
            self.unsatisfied.pop(placement.demand, None)
            borrowed = self._borrowed(placement, by_id[placement.demand]) if borrowing else None
            placements.append(replace(placement, reservation=reservation, borrowed=borrowed))
        self.placements.extend(placements)
        self.preemptions.extend(result.preemptions)
        self.fleet.apply(replace(result, placements=tuple(placements)), by_id)
        result = held_waits(
            result,
            snapshot=snapshot,
            held=self.held,
            reservations=self.owner,
            # The waiting demands on the fleet this pass leaves, with held VMs legal victims.
            what_if=lambda ids: self.plan_one(
                self.fleet.snapshot_for(
                    [by_id[demand] for demand in ids],
                    held_back=held_back,
                    borrowers=borrowers,
                    pools=pools,
                )
            ),
        )
        for entry in result.unsatisfied:
            words = self._kept_words(by_id[entry.demand], held_back)
            self.unsatisfied[entry.demand] = replace(entry, reason=entry.reason + words)

    def _borrow(self, order: list[list[Demand]]) -> None:
        """Spot groups the ordinary pass left waiting borrow other tenants' kept blocks: one
        pass per tenant that has a reservation itself (its own stay held back), one for the
        rest."""
        kinds = {pool.name: pool.kind for pool in self.snapshot.pools}
        owners = {r.tenant: r.id for r in self.snapshot.reservations}
        lenders = {rid for rid, blocks in self.kept.items() if blocks}
        buckets: dict[str | None, list[Demand]] = {}
        for group in order:
            tenant = group[0].tenant
            if group[0].id not in self.unsatisfied or any(
                kinds[demand.pool] != "spot" for demand in group
            ):
                continue
            if not lenders - {owners.get(tenant)}:
                continue
            buckets.setdefault(tenant if tenant in owners else None, []).extend(group)
        for tenant, demands in buckets.items():
            own = owners.get(tenant) if tenant is not None else None
            held_back = [(own, block) for block in self.kept.get(own, [])] if own else []
            self._pass(demands, held_back=held_back, borrowing=True)

    def _borrowed(self, placement: Placement, demand: Demand) -> str | None:
        """The reservation whose kept block the placement takes GPUs of, if any."""
        for r in self.snapshot.reservations:
            if r.tenant == demand.tenant:
                continue
            for node, gpus in self.kept.get(r.id, ()):
                if node == placement.node and set(gpus) & set(placement.gpus):
                    return r.id
        return None

    def _kept_words(self, demand: Demand, held_back: list[tuple[str, Block]]) -> str:
        """What the demand could not use: blocks held back for reservations that have a
        partition of its size free of anything but kept GPUs."""
        nodes = {node.name: node for node in self.snapshot.nodes}
        fabric = self.snapshot.capacity_set.fabric
        kept: dict[str, dict[str, set[int]]] = {}
        for rid, (node, gpus) in held_back:
            kept.setdefault(rid, {}).setdefault(node, set()).update(gpus)
        words = ""
        for rid, by_node in kept.items():
            fits = False
            for name, gpus in by_node.items():
                busy = self.fleet.busy(nodes[name])
                fits = fits or any(
                    len(block) == demand.gpus and set(block) & gpus and not set(block) & busy
                    for block in partition_table(nodes[name], fabric)
                )
            if fits:
                tenant = self.owner[rid].tenant
                total = sum(len(gpus) for gpus in by_node.values())
                noun = "GPU" if total == 1 else "GPUs"
                words += (
                    f"; {total} {noun} kept free for tenant {tenant}'s reservation "
                    f"{rid} could serve it, but only {tenant}'s claims and other tenants' spot "
                    f"demands may use them"
                )
        return words

    # -- the merged plan -------------------------------------------------------------------

    def _lent(self, rid: str) -> int:
        """GPUs the reservation's borrowers still hold: that part of it is lent, not kept."""
        return sum(
            len(vm.gpus)
            for vm_id, of in self.borrowers.items()
            if of == rid and (vm := self.fleet.vms.get(vm_id)) is not None
        )

    def _holding(self, tenant: str) -> int:
        """GPUs the tenant's running VMs and its placements so far hold."""
        return sum(
            len(vm.gpus)
            for vm in self.fleet.vms.values()
            if vm.tenant == tenant and (vm.state == "running" or vm.id in self.fleet.demands)
        )

    def _merged(self) -> Plan:
        return merged_plan(
            self.snapshot,
            placements=self.placements,
            preemptions=self.preemptions,
            unsatisfied=list(self.unsatisfied.values()),
            borrowers=self.borrowers,
        )

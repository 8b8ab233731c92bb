"""A plan with reservations (issue 19), and each reservation after it: what its tenant holds,
what is kept, who borrows it, and what claiming its unused part right after the plan would
reclaim. `plan_reserved` is where `planner.plan` sends a snapshot with reservations.

Reservations asking more than the set's ready shared GPUs (a node went down, was cordoned or
lost a GPU) are honoured as far as those GPUs go, in the snapshot's order (a caller lists the
oldest first, so the newest is the one cut), each in whole blocks (`honoured`): the plan is
made with each reservation cut to what is honoured, and its report says how far it is short.
Refusing the snapshot instead would leave the whole set unplanned the moment a node fails.

The hypothetical claim is planned on the fleet as the plan leaves it (placements running,
victims gone), like a real claim: ceil(U / block_gpus) demands of ``block_gpus`` GPUs, each a
group of its own (so a claim that can be served only in part still shows what that part would
reclaim), in the tenant's best-ranked pool (the best rank among the pools of its VMs and
demands in the snapshot; without any, the best-ranked pool of the set: the preview then shows
the most a claim could reclaim), with the VMs borrowing from the reservation reclaimed first
and the other reservations' kept blocks held back; the VMs held inside the reservations after
the plan (held.py, the claims' placements first) are no victims of it. This is what the set
page shows as "what claiming it would reclaim" and what a new reservation's preview shows.
"""

from __future__ import annotations

from dataclasses import replace

from gpucap.arbiter.held import held_vms
from gpucap.arbiter.model import Demand, Plan, Reservation, ReservationReport, Snapshot
from gpucap.arbiter.reservations import (
    BORROWED_POOL,
    EPOCH,
    Fleet,
    Passes,
    Planner,
    blocks_wanted,
    borrowing,
    held,
)
from gpucap.arbiter.topology import ready_shared_gpus

__all__ = ["honoured", "plan_reserved", "reports"]


def honoured(snapshot: Snapshot) -> dict[str, int]:
    """Per reservation, the GPUs the set's ready shared nodes can honour: in the snapshot's
    order, each takes what is left of those GPUs, in whole blocks, up to its ``gpus``."""
    left = ready_shared_gpus(snapshot.nodes)
    given: dict[str, int] = {}
    for r in snapshot.reservations:
        given[r.id] = min(r.gpus, left // r.block_gpus * r.block_gpus)
        left -= given[r.id]
    return given


def plan_reserved(snapshot: Snapshot, plan_one: Planner) -> Plan:
    """The plan of a snapshot with reservations (reservations.py), with each reservation's
    report; ``plan_one`` plans a snapshot without any (`planner.plan`). The passes see each
    reservation cut to what is `honoured`; the reports give what was asked and the shortfall."""
    given = honoured(snapshot)
    cut = replace(
        snapshot,
        reservations=tuple(replace(r, gpus=given[r.id]) for r in snapshot.reservations),
    )
    passes = Passes(cut, plan_one)
    merged = passes.run()
    asked = {r.id: r.gpus for r in snapshot.reservations}
    return replace(
        merged,
        reservations=tuple(
            replace(report, gpus=asked[report.id], short_gpus=asked[report.id] - report.gpus)
            for report in reports(cut, merged, passes, plan_one)
        ),
    )


def reports(
    snapshot: Snapshot, plan: Plan, passes: Passes, plan_one: Planner
) -> tuple[ReservationReport, ...]:
    """One report per reservation, in the snapshot's order."""
    demands = {demand.id: demand for demand in snapshot.demands}
    after = Fleet(snapshot)
    after.apply(plan, demands, state="running")
    borrowed_gpus: dict[str, set[int]] = {}
    for placement in plan.placements:
        if placement.borrowed is not None:
            borrowed_gpus.setdefault(placement.node, set()).update(placement.gpus)
    still_kept = {
        rid: [
            (node, gpus) for node, gpus in blocks if not set(gpus) & borrowed_gpus.get(node, set())
        ]
        for rid, blocks in passes.kept.items()
    }
    spared = frozenset(_held_after(snapshot, after))
    return tuple(
        _report(snapshot, plan, passes, plan_one, after, still_kept, spared, reservation)
        for reservation in snapshot.reservations
    )


def _held_after(snapshot: Snapshot, after: Fleet) -> dict[str, str]:
    """The VMs held inside the reservations once the plan is carried out (its claims' VMs are
    then placed inside them)."""
    vms = after.vms.values()
    lenders = borrowing(snapshot.reservations, snapshot.pools, vms)
    return held_vms(snapshot.reservations, vms, lenders)


def _report(
    snapshot: Snapshot,
    plan: Plan,
    passes: Passes,
    plan_one: Planner,
    after: Fleet,
    still_kept: dict[str, list],
    spared: frozenset[str],
    reservation: Reservation,
) -> ReservationReport:
    rid, tenant = reservation.id, reservation.tenant
    holding = sum(
        len(vm.gpus) for vm in after.vms.values() if vm.tenant == tenant and vm.state == "running"
    )
    lenders = [vm for vm, of in passes.borrowers.items() if of == rid and vm in after.vms]
    lenders += [p.demand for p in plan.placements if p.borrowed == rid]
    reclaims, complete = _claim(
        snapshot, plan_one, after, still_kept, spared, reservation, holding, lenders
    )
    kinds = {pool.name: pool.kind for pool in snapshot.pools}
    taken_over = [
        vm
        for vm in reclaims
        if after.vms[vm].tenant != tenant and kinds.get(after.vms[vm].pool) == "spot"
    ]
    return ReservationReport(
        id=rid,
        tenant=tenant,
        gpus=reservation.gpus,
        block_gpus=reservation.block_gpus,
        held_before=held(snapshot, tenant),
        held_after=holding,
        kept_gpus=reservation.block_gpus * len(still_kept.get(rid, ())),
        borrowed=tuple(sorted(set(lenders) | set(taken_over))),
        claim_reclaims=reclaims,
        claim_complete=complete,
        kept_blocks=tuple(passes.kept.get(rid, ())),
        claim_blocks=tuple(passes.claim_blocks.get(rid, ())),
    )


def _claim(
    snapshot: Snapshot,
    plan_one: Planner,
    after: Fleet,
    still_kept: dict[str, list],
    spared: frozenset[str],
    reservation: Reservation,
    holding: int,
    lenders: list[str],
) -> tuple[tuple[str, ...], bool]:
    """The VMs a claim of the whole unused part would reclaim, and whether it is served."""
    count = blocks_wanted(reservation, holding)
    if not count:
        return (), True
    moment = snapshot.now or EPOCH
    pool = _claim_pool(snapshot, reservation.tenant)
    demands = [
        Demand(
            id=f"~claim/{reservation.id}/{number}",
            group=f"~claim/{reservation.id}/{number:05d}",
            pool=pool,
            gpus=reservation.block_gpus,
            requested_at=moment,
            tenant=reservation.tenant,
        )
        for number in range(count)
    ]
    held_back = [
        (rid, block)
        for rid, blocks in still_kept.items()
        if rid != reservation.id
        for block in blocks
    ]
    result = plan_one(
        after.snapshot_for(
            demands,
            held_back=held_back,
            borrowers=lenders,
            pools=[after.lowest_pool(BORROWED_POOL)] if lenders else [],
        ),
        held=spared,
    )
    return tuple(sorted(p.vm for p in result.preemptions)), not result.unsatisfied


def _claim_pool(snapshot: Snapshot, tenant: str) -> str:
    """The tenant's best-ranked pool in the snapshot, else the set's best-ranked pool."""
    rank = {pool.name: pool.rank for pool in snapshot.pools}
    used = {vm.pool for vm in snapshot.vms if vm.tenant == tenant}
    used |= {demand.pool for demand in snapshot.demands if demand.tenant == tenant}
    return min(used or rank, key=rank.__getitem__)

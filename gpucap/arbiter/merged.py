"""A plan made in passes (reservations.py), as one plan: the preemption reasons worded over
the whole plan's counts, in the real pools, and the pools' balances.

A pass counts a pool's GPUs from its own start, and a claim pass sees its borrowers in a pool of
their own; so every reason is worded again here, in the order of the merged plan, exactly as
the planner words it (`explain.preemption_reason`, with the job's words), except a claim's
reclaim of its own borrower, which says so.
"""

from __future__ import annotations

from dataclasses import replace

from gpucap.arbiter import explain
from gpucap.arbiter.model import (
    Placement,
    Plan,
    PoolBalance,
    Preemption,
    Snapshot,
    Unsatisfied,
    Vm,
)

__all__ = ["merged_plan"]


def merged_plan(
    snapshot: Snapshot,
    *,
    placements: list[Placement],
    preemptions: list[Preemption],
    unsatisfied: list[Unsatisfied],
    borrowers: dict[str, str],
) -> Plan:
    """The passes' placements, preemptions and waits as one plan of ``snapshot``;
    ``borrowers`` maps each VM borrowing from a reservation to it."""
    reworded = tuple(_reworded(snapshot, placements, preemptions, borrowers))
    return Plan(
        complete=not unsatisfied,
        placements=tuple(placements),
        preemptions=reworded,
        unsatisfied=tuple(unsatisfied),
        pools=_balances(snapshot, tuple(placements), reworded),
    )


def _reworded(
    snapshot: Snapshot,
    placements: list[Placement],
    preemptions: list[Preemption],
    borrowers: dict[str, str],
) -> list[Preemption]:
    """The preemptions in the real pools, each reason worded for the whole plan's counts
    (a pass saw borrowers in a pool of their own, and counts from its own start)."""
    pools = {pool.name: pool for pool in snapshot.pools}
    vms = {vm.id: vm for vm in snapshot.vms}
    demands = {demand.id: demand for demand in snapshot.demands}
    by_demand = {placement.demand: placement for placement in placements}
    counts = dict.fromkeys(pools, 0)
    replicas = {d.name: 0 for d in snapshot.deployments}
    for vm in snapshot.vms:
        if vm.state == "running":
            counts[vm.pool] += len(vm.gpus)
            if vm.deployment is not None:
                replicas[vm.deployment] += 1
    minimum = {d.name: d.min_replicas for d in snapshot.deployments}
    out = []
    for preemption in preemptions:
        vm = vms[preemption.vm]
        demand = demands[preemption.for_demand]
        placement = by_demand[demand.id]
        pool, demand_pool = pools[vm.pool], pools[demand.pool]
        counts[vm.pool] -= len(vm.gpus)
        if vm.deployment is not None:
            replicas[vm.deployment] -= 1
        if placement.reservation is not None and borrowers.get(vm.id) == (placement.reservation):
            reason = (
                f"reclaimed for {demand.id} (tenant {demand.tenant}'s claim on its "
                f"reservation {placement.reservation}): it borrowed capacity kept for that "
                f"reservation"
            )
        else:
            reason = explain.preemption_reason(
                demand=demand.id,
                demand_pool=demand_pool.name,
                demand_rank=demand_pool.rank,
                pool=pool.name,
                rank=pool.rank,
                floor_gpus=pool.floor_gpus,
                held_before=counts[vm.pool] + len(vm.gpus),
                held_after=counts[vm.pool],
                deployment=vm.deployment,
                replicas_after=replicas.get(vm.deployment, 0),
                min_replicas=minimum.get(vm.deployment, 0),
            )
        reason += _job_words(vm, placement, vms)
        out.append(replace(preemption, pool=vm.pool, reason=reason))
    return out


def _job_words(vm: Vm, placement: Placement, vms: dict[str, Vm]) -> str:
    if vm.group is None:
        return ""
    members = [vms[other] for other in placement.preempts if vms[other].group == vm.group]
    if len(members) < 2:
        return ""
    gpus = sum(len(member.gpus) for member in members)
    return "; " + explain.job_reason(group=vm.group, vms=len(members), gpus=gpus)


def _balances(
    snapshot: Snapshot, placements: tuple[Placement, ...], preemptions: tuple[Preemption, ...]
) -> tuple[PoolBalance, ...]:
    before = {pool.name: 0 for pool in snapshot.pools}
    for vm in snapshot.vms:
        if vm.state == "running":
            before[vm.pool] += len(vm.gpus)
    after = dict(before)
    for preemption in preemptions:
        after[preemption.pool] -= len(preemption.gpus)
    demand_pool = {demand.id: demand.pool for demand in snapshot.demands}
    for placement in placements:
        after[demand_pool[placement.demand]] += len(placement.gpus)
    return tuple(
        PoolBalance(p.name, p.rank, before[p.name], after[p.name], p.floor_gpus)
        for p in sorted(snapshot.pools, key=lambda pool: pool.rank)
    )

"""Protection windows (rule 3a): fresh work is not a victim.

A pool may set ``protect_seconds``: a running VM of the pool that started or resumed less than
that long before the snapshot's ``now`` is protected. The planner treats its GPUs like an
on-demand VM's: no reclaim may take them. So when any other complete plan exists the planner
finds it (its search is over legal victims only), and when only protected VMs could serve a
group, the group waits.

Such a wait is explained with the moment it ends. `explain_waits` plans the same snapshot once
more with protection ignored; a group left waiting by the real plan but served by that one
waits for protection, and its ``waits_until`` is the latest protection end among the protected
VMs that plan preempts for it or for a group served before it (those choices come first in the
order of service; once all their protection has ended, the same choices are legal). The time
comes from the snapshot alone: no clock is read, so the plan stays a pure function. The second plan
is made only when some protected VM ranks below some waiting demand (otherwise rule 3 alone
keeps them apart); it doubles the planning time of such a snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from gpucap.arbiter import explain
from gpucap.arbiter.model import Plan, Snapshot


def protected_vms(snapshot: Snapshot) -> dict[str, datetime]:
    """VM id -> end of its protection, for every VM protected at the snapshot's ``now``.

    On-demand VMs are never victims anyway and VMs under notice are leaving: neither is
    listed."""
    now = snapshot.now
    if now is None:
        return {}
    pools = {pool.name: pool for pool in snapshot.pools if pool.protect_seconds > 0}
    if not pools:
        return {}
    protected = {}
    for vm in snapshot.vms:
        pool = pools.get(vm.pool)
        if pool is None or pool.kind == "on_demand":
            continue
        if vm.state != "running":
            continue
        end = vm.started_at + timedelta(seconds=pool.protect_seconds)
        if now < end:
            protected[vm.id] = end
    return protected


def explain_waits(
    snapshot: Snapshot,
    plan: Plan,
    unprotected: Callable[[], Plan],
    keep: frozenset[str] = frozenset(),
) -> Plan:
    """``plan`` with the waits that protection causes explained and timed (see module docs).
    ``unprotected`` makes the plan of the same snapshot with protection ignored; the groups in
    ``keep`` (refused for a quota) keep their reasons whatever that plan does."""
    protected = protected_vms(snapshot)
    if not plan.unsatisfied or not protected:
        return plan
    rank = {pool.name: pool.rank for pool in snapshot.pools}
    demand_pool = {demand.id: demand.pool for demand in snapshot.demands}
    best_waiting = min(rank[demand_pool[entry.demand]] for entry in plan.unsatisfied)
    vm_rank = {vm.id: rank[vm.pool] for vm in snapshot.vms}
    if all(vm_rank[vm_id] <= best_waiting for vm_id in protected):
        return plan  # no waiting demand may reclaim a protected VM (rule 3): not their waits
    ignoring = unprotected()
    groups = {demand.id: demand.group for demand in snapshot.demands}
    vm_pool = {vm.id: vm.pool for vm in snapshot.vms}
    # Walk the plan that ignores protection in its order of service: the latest protection end
    # among the victims of each group and of every group served before it.
    latest: tuple[datetime, str] | None = None
    until: dict[str, tuple[datetime, str]] = {}
    for placement in ignoring.placements:
        for vm_id in placement.preempts:
            if vm_id in protected and (latest is None or protected[vm_id] > latest[0]):
                latest = (protected[vm_id], vm_id)
        if latest is not None:
            until[groups[placement.demand]] = latest
    if not until:
        return plan
    pools = {pool.name: pool for pool in snapshot.pools}
    unsatisfied = []
    for entry in plan.unsatisfied:
        found = until.get(entry.group)
        if found is None or entry.group in keep:
            unsatisfied.append(entry)
            continue
        end, vm_id = found
        pool = pools[vm_pool[vm_id]]
        reason = explain.protected_reason(
            until=end, now=snapshot.now, pool=pool.name, protect_seconds=pool.protect_seconds
        )
        unsatisfied.append(replace(entry, reason=reason, waits_until=end))
    return replace(plan, unsatisfied=tuple(unsatisfied))

"""What a reservation's tenant uses is held inside it (rule 4 of reservations, model.py).

A reservation promises its tenant N GPUs. Kept blocks and claims (reservations.py) protect the
part the tenant does not use; this protects the part it uses: while the reservation is in
force, the tenant's running VMs up to N GPUs are **held** inside it and are no victims of any
demand. Without it an ordinary demand of a higher-ranked pool could reclaim the very VM a claim
just placed, take the tenant below N, and the tenant would claim again from free capacity only:
the promise broken, and the set ping-ponging between the two.

Which VMs (`held_vms`), per reservation, in this order, whole VMs, while what is held so far is
below N (the GPUs honoured): first the VMs a claim placed inside this reservation (``Vm.
reservation``, the flag the live VM and the simulator carry from the placement), then the
tenant's other running VMs; each part oldest ``started_at`` first, then by id. A VM validly
flagged ``borrowed`` (it sits on another reservation's kept capacity) is never held. The last VM
may take what is held past N, since a VM is never cut: so a tenant running H GPUs outside
borrowed capacity is never taken below min(N, H). A running job with a held member is kept
whole (whole jobs: a job with a member no reclaim may take is reclaimed by no one), so its
other members are spared too.

Nobody may reclaim a held VM, the tenant's own higher-ranked demands included. What an operator
sells is that the work running inside a reservation runs until its tenant stops it or the
reservation ends; the tenant's own demands are served from its unused part (claims), free
capacity, or by reclaiming others and its own VMs beyond N, which are ordinary. Letting them
reclaim a held VM would also send that VM back as a claim on the same reservation: churn inside
one tenant. And a held VM is then simply fixed, as an on-demand VM is, in every pass: one rule
for the planner (``planner.plan``'s ``held``) and one check for the referee.

A group left waiting in a pass that a plan of the same fleet with held VMs as legal victims
serves, by reclaiming held VMs for it or for a group served before it, waits because of them
(as protection's waits are found, protection.py): its reason says whose reservations hold them
(`held_waits`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from gpucap.arbiter import explain
from gpucap.arbiter.model import Plan, Reservation, Snapshot, Unsatisfied, Vm
from gpucap.arbiter.topology import partition_table

__all__ = ["held_vms", "held_waits"]


def held_vms(
    reservations: Iterable[Reservation], vms: Iterable[Vm], borrowers: Mapping[str, str]
) -> dict[str, str]:
    """VM id -> the reservation it is held inside (rule 4, module docs), for ``reservations``
    cut to the GPUs honoured. ``borrowers``: the VMs validly borrowing (never held)."""
    tenants = {r.tenant: r for r in reservations}
    running: dict[str, list[Vm]] = {}
    for vm in vms:
        if vm.state == "running" and vm.tenant in tenants and vm.id not in borrowers:
            running.setdefault(vm.tenant, []).append(vm)
    held: dict[str, str] = {}
    for tenant, candidates in running.items():
        r = tenants[tenant]
        candidates.sort(key=lambda vm: (vm.reservation != r.id, vm.started_at, vm.id))
        holding = 0
        for vm in candidates:
            if holding >= r.gpus:
                break
            held[vm.id] = r.id
            holding += len(vm.gpus)
    return held


def held_waits(
    plan: Plan,
    *,
    snapshot: Snapshot,
    held: Mapping[str, str],
    reservations: Mapping[str, Reservation],
    what_if: Callable[[list[str]], Plan],
) -> Plan:
    """``plan`` (of ``snapshot``, with the ``held`` VMs spared) with the waits that only held
    VMs cause said in words. ``what_if(demand ids)`` plans those demands on the fleet the plan
    leaves, with held VMs as legal victims. It is asked only for the waiting groups that some
    held VM could serve by rank (rule 3), kind (rule 1) and size: a running held VM of a pool
    ranked below one of the group's demands, on a ready node with a partition of that demand's
    size that takes one of its GPUs (`_reach`); without any, nothing is planned again."""
    waiting = [entry for entry in plan.unsatisfied if entry.waits_until is None]
    if not waiting or not held:
        return plan
    reach = _reach(snapshot, held)
    if not reach:
        return plan
    rank = {pool.name: pool.rank for pool in snapshot.pools}
    demands = {demand.id: demand for demand in snapshot.demands}
    members: dict[str, list[str]] = {}
    for entry in waiting:
        members.setdefault(entry.group, []).append(entry.demand)
    asked = [
        demand_id
        for ids in members.values()
        if any(rank[demands[i].pool] < reach.get(demands[i].gpus, 0) for i in ids)
        for demand_id in ids
    ]
    if not asked:
        return plan
    ignoring = what_if(asked)
    # In the what-if's order of service: the reservations whose held VMs it reclaims for each
    # group and for every group served before it.
    named: list[str] = []
    blamed: dict[str, list[str]] = {}
    for placement in ignoring.placements:
        for vm_id in placement.preempts:
            rid = held.get(vm_id)
            if rid is not None and rid not in named:
                named.append(rid)
        if named:
            blamed[demands[placement.demand].group] = list(named)
    if not blamed:
        return plan
    gpus = _held_gpus(snapshot.vms, held)
    unsatisfied: list[Unsatisfied] = []
    for entry in plan.unsatisfied:
        rids = blamed.get(entry.group) if entry.waits_until is None else None
        if rids is None:
            unsatisfied.append(entry)
            continue
        holders = [(reservations[rid].tenant, gpus[rid], rid) for rid in sorted(rids)]
        unsatisfied.append(replace(entry, reason=explain.held_reason(holders=holders)))
    return replace(plan, unsatisfied=tuple(unsatisfied))


def _reach(snapshot: Snapshot, held: Mapping[str, str]) -> dict[int, int]:
    """Per block size, the worst (largest) rank of a running held VM that a demand of that size
    could reclaim but for being held: not on-demand, on a ready node with a partition of the
    size, free of failed GPUs, that takes one of its GPUs."""
    pools = {pool.name: pool for pool in snapshot.pools}
    nodes = {node.name: node for node in snapshot.nodes}
    fabric = snapshot.capacity_set.fabric
    reach: dict[int, int] = {}
    for vm in snapshot.vms:
        if vm.id not in held or vm.state != "running":
            continue
        pool, node = pools[vm.pool], nodes[vm.node]
        if pool.kind == "on_demand" or node.state != "ready":
            continue
        for block in partition_table(node, fabric):
            if set(block) & set(vm.gpus) and not set(block) & set(node.failed_gpus):
                size = len(block)
                reach[size] = max(reach.get(size, 0), pool.rank)
    return reach


def _held_gpus(vms: Iterable[Vm], held: Mapping[str, str]) -> dict[str, int]:
    gpus: dict[str, int] = {}
    for vm in vms:
        rid = held.get(vm.id)
        if rid is not None and vm.state == "running":
            gpus[rid] = gpus.get(rid, 0) + len(vm.gpus)
    return gpus

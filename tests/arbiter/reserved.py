"""The referee's view of reservations (issue 19), independent of gpucap/arbiter/reservations.py.

`Reserved` says which preemptions the rules exempt (a claim reclaiming a VM that borrows from
its own reservation ignores rank, floor and protection), which free GPUs a placement may not
count as free capacity (rule 6), and lists every way a plan breaks the reservation rules:
claims past the unused part or of another tenant, kept blocks that are no free partitions of
the reservation's size, kept capacity used by anyone but the tenant and borrowers, a
reservation kept short while an ordinary placement took a block it could have kept, a claim
reclaiming others while a partition held only by its borrowers was there, and reports that
misstate what the tenant holds, what is kept, who borrows or how far it is short; and (rule 4)
a VM held inside a reservation preempted, or named among what a claim would reclaim once the
plan is carried out. A reservation is judged by the GPUs honoured (`honoured`): reservations
asking more than the set's ready shared GPUs are honoured in the order given, in whole blocks.
"""

from __future__ import annotations

import math

from gpucap.arbiter.model import Placement, Plan, Preemption, Reservation, Snapshot, Vm
from gpucap.arbiter.topology import partition_table

Gpus = set[tuple[str, int]]


def honoured(snapshot: Snapshot) -> dict[str, int]:
    """Per reservation, the GPUs of it the set's working GPUs on ready shared nodes honour."""
    left = sum(
        1
        for node in snapshot.nodes
        if node.state == "ready" and node.tenant is None
        for index in range(node.gpus)
        if index not in node.failed_gpus
    )
    given = {}
    for r in snapshot.reservations:
        given[r.id] = min(r.gpus, r.block_gpus * (left // r.block_gpus))
        left -= given[r.id]
    return given


def held_inside(
    reservations: list[Reservation], given: dict[str, int], vms: list[Vm], borrowers: set[str]
) -> dict[str, str]:
    """VM id -> reservation, for the VMs held inside the reservations (rule 4): per
    reservation, its tenant's running VMs that borrow nothing, those placed inside it first,
    then the rest, each oldest first (then by id), taken whole while fewer than the GPUs
    honoured are held."""
    held = {}
    for r in reservations:
        mine = [
            vm
            for vm in vms
            if vm.tenant == r.tenant and vm.state == "running" and vm.id not in borrowers
        ]
        holding = 0
        for vm in sorted(mine, key=lambda vm: (vm.reservation != r.id, vm.started_at, vm.id)):
            if holding < given[r.id]:
                held[vm.id] = r.id
                holding += len(vm.gpus)
    return held


def _gpus(blocks) -> Gpus:
    return {(node, index) for node, gpus in blocks for index in gpus}


class Reserved:
    def __init__(self, snapshot: Snapshot, plan: Plan) -> None:
        self.snapshot, self.plan = snapshot, plan
        self.reservations = {r.id: r for r in snapshot.reservations}
        self.honoured = honoured(snapshot)
        kinds = {pool.name: pool.kind for pool in snapshot.pools}
        self.kinds = kinds
        owners = {r.id: r.tenant for r in snapshot.reservations}
        self.borrowers = {
            vm.id: vm.borrowed
            for vm in snapshot.vms
            if vm.borrowed in owners
            and vm.state == "running"
            and kinds[vm.pool] == "spot"
            and vm.tenant != owners[vm.borrowed]
        }
        self.placement = {p.demand: p for p in plan.placements}
        self.demands = {d.id: d for d in snapshot.demands}
        reports = {report.id: report for report in plan.reservations}
        self.reports = reports
        self.kept = {rid: _gpus(report.kept_blocks) for rid, report in reports.items()}
        self.claim_kept = {rid: _gpus(report.claim_blocks) for rid, report in reports.items()}
        self.held = held_inside(
            list(snapshot.reservations), self.honoured, list(snapshot.vms), set(self.borrowers)
        )

    def exempt(self, preemption: Preemption) -> bool:
        """A claim's reclaim of a VM borrowing from the claim's reservation."""
        placement = self.placement.get(preemption.for_demand)
        return (
            placement is not None
            and placement.reservation is not None
            and self.borrowers.get(preemption.vm) == placement.reservation
        )

    def off_limits(self, placement: Placement) -> Gpus:
        """Free GPUs that are not free capacity for this placement (rule 6)."""
        demand = self.demands[placement.demand]
        if placement.reservation is not None:
            return set().union(
                *(gpus for rid, gpus in self.claim_kept.items() if rid != placement.reservation)
            )
        if placement.borrowed is not None:
            return set().union(
                *(
                    gpus
                    for rid, gpus in self.kept.items()
                    if self.reservations[rid].tenant == demand.tenant
                )
            )
        return set().union(*self.kept.values())

    # -- the rules -------------------------------------------------------------------------

    def violations(self) -> list[str]:
        if not self.snapshot.reservations:
            return self._unreserved()
        problems = []
        if [r.id for r in self.plan.reservations] != list(self.reservations):
            return ["the plan does not report every reservation, in order"]
        claims = [p for p in self.plan.placements if p.reservation is not None]
        problems += self._claims(claims)
        keep_free = self._free_at_keep_time(claims)
        for rid, report in self.reports.items():
            problems += self._kept(rid, report, keep_free, claims)
            problems += self._report(rid, report)
        problems += self._borrowers_first(claims)
        problems += self._held()
        return problems

    def _unreserved(self) -> list[str]:
        marked = [p.demand for p in self.plan.placements if p.reservation or p.borrowed]
        if marked or self.plan.reservations:
            return [f"a plan without reservations marks placements {marked} or reports some"]
        return []

    def _claims(self, claims: list[Placement]) -> list[str]:
        problems = []
        for rid, r in self.reservations.items():
            mine = [p for p in claims if p.reservation == rid]
            unused = max(0, self.honoured[rid] - self._held_before(r.tenant))
            if sum(len(p.gpus) for p in mine) > unused:
                problems.append(f"reservation {rid}: claims take more than its unused {unused}")
            for p in mine:
                if self.demands[p.demand].tenant != r.tenant:
                    problems.append(f"{p.demand} claims {rid} of another tenant")
        if self.plan.placements[: len(claims)] != tuple(claims):
            problems.append("claims are not served first")
        return problems

    def _free_at_keep_time(self, claims: list[Placement]) -> Gpus:
        """GPUs of ready shared nodes free once the claims are served."""
        held = {(vm.node, i) for vm in self.snapshot.vms for i in vm.gpus}
        for p in claims:
            for vm_id in p.preempts:
                vm = next(v for v in self.snapshot.vms if v.id == vm_id)
                held -= {(vm.node, i) for i in vm.gpus}
            held |= {(p.node, i) for i in p.gpus}
        return {
            (node.name, index)
            for node in self.snapshot.nodes
            if node.state == "ready" and node.tenant is None
            for index in range(node.gpus)
            if index not in node.failed_gpus and (node.name, index) not in held
        }

    def _kept(self, rid: str, report, free: Gpus, claims: list[Placement]) -> list[str]:
        r = self.reservations[rid]
        problems = []
        nodes = {node.name: node for node in self.snapshot.nodes}
        fabric = self.snapshot.capacity_set.fabric
        for node, gpus in report.kept_blocks:
            if len(gpus) != r.block_gpus or gpus not in partition_table(nodes[node], fabric):
                problems.append(f"{rid}: kept {node} {gpus} is not a {r.block_gpus}-GPU block")
            if not {(node, i) for i in gpus} <= free:
                problems.append(f"{rid}: kept {node} {gpus} was not free once claims were served")
        for other, gpus in self.kept.items():
            if other != rid and gpus & self.kept[rid]:
                problems.append(f"{rid}: kept blocks overlap those of {other}")
        claimed = [p for p in claims if self.demands[p.demand].tenant == r.tenant]
        lost = [
            vm.gpus
            for p in claims
            for vm in self.snapshot.vms
            if vm.id in p.preempts and vm.tenant == r.tenant
        ]
        reclaimed = {vm for p in claims for vm in p.preempts}
        lent = sum(
            len(vm.gpus)
            for vm in self.snapshot.vms
            if self.borrowers.get(vm.id) == rid and vm.id not in reclaimed
        )
        holding = (
            self._held_before(r.tenant)
            + sum(len(p.gpus) for p in claimed)
            - sum(len(g) for g in lost)
            + lent
        )
        wanted = math.ceil(max(0, self.honoured[rid] - holding) / r.block_gpus)
        if len(report.kept_blocks) > wanted:
            problems.append(f"{rid}: keeps {len(report.kept_blocks)} blocks, wants {wanted}")
        later = [p for p in self.plan.placements if p.reservation is None]
        for p in later:
            taken = {(p.node, i) for i in p.gpus}
            if taken & self.kept[rid] and not (
                p.borrowed is not None
                and self.kinds[self.demands[p.demand].pool] == "spot"
                and self.demands[p.demand].tenant != r.tenant
            ):
                problems.append(f"{rid}: {p.demand} takes kept capacity without borrowing it")
            if len(report.kept_blocks) < wanted and p.borrowed is None:
                all_kept = set().union(*self.kept.values())
                for block in partition_table(nodes[p.node], fabric):
                    whole = {(p.node, i) for i in block}
                    if len(block) == r.block_gpus and taken & whole and whole <= free - all_kept:
                        problems.append(f"{rid}: kept short while {p.demand} took a free block")
        untouched = [
            block
            for block in report.kept_blocks
            if not any(
                p.node == block[0] and set(p.gpus) & set(block[1]) for p in self.plan.placements
            )
        ]
        if report.kept_gpus != r.block_gpus * len(untouched):
            problems.append(f"{rid}: kept_gpus {report.kept_gpus} misstates its free blocks")
        return problems

    def _report(self, rid: str, report) -> list[str]:
        r = self.reservations[rid]
        problems = []
        preempted = {p.vm for p in self.plan.preemptions}
        after = self._held_before(r.tenant) - sum(
            len(vm.gpus) for vm in self.snapshot.vms if vm.id in preempted and vm.tenant == r.tenant
        )
        after += sum(
            len(p.gpus) for p in self.plan.placements if self.demands[p.demand].tenant == r.tenant
        )
        if (report.held_before, report.held_after) != (self._held_before(r.tenant), after):
            problems.append(f"{rid}: held {report.held_before} -> {report.held_after} misstated")
        must = {vm for vm, of in self.borrowers.items() if of == rid and vm not in preempted}
        must |= {p.demand for p in self.plan.placements if p.borrowed == rid}
        if not must <= set(report.borrowed):
            problems.append(f"{rid}: borrowers {sorted(must - set(report.borrowed))} not listed")
        if list(report.borrowed) != sorted(set(report.borrowed)):
            problems.append(f"{rid}: borrowed is not sorted")
        short = r.gpus - self.honoured[rid]
        if (report.gpus, report.short_gpus) != (r.gpus, short):
            problems.append(f"{rid}: {report.gpus} GPUs, {report.short_gpus} short, not {short}")
        if after >= self.honoured[rid] and (report.claim_reclaims or not report.claim_complete):
            problems.append(f"{rid}: fully used, yet a claim would reclaim or fail")
        on_demand = {vm.id for vm in self.snapshot.vms if self.kinds[vm.pool] == "on_demand"} | {
            p.demand
            for p in self.plan.placements
            if self.kinds[self.demands[p.demand].pool] == "on_demand"
        }
        if set(report.claim_reclaims) & (on_demand | preempted):
            problems.append(f"{rid}: a claim would reclaim an on-demand or departed VM")
        return problems

    def _borrowers_first(self, claims: list[Placement]) -> list[str]:
        """A claim that preempts a VM not borrowing from its reservation had no partition of
        its size held only by its running borrowers (whole jobs of them) to take instead."""
        problems = []
        nodes = {node.name: node for node in self.snapshot.nodes}
        fabric = self.snapshot.capacity_set.fabric
        vms = {vm.id: vm for vm in self.snapshot.vms}
        gone: set[str] = set()
        for p in claims:
            rid = p.reservation
            others = [vm for vm in p.preempts if self.borrowers.get(vm) != rid]
            if others:
                mine = {
                    vm_id
                    for vm_id, of in self.borrowers.items()
                    if of == rid
                    and vm_id not in gone
                    and all(
                        self.borrowers.get(mate.id) == rid
                        for mate in vms.values()
                        if vms[vm_id].group is not None and mate.group == vms[vm_id].group
                    )
                }
                holders = {(vms[v].node, i): v for v in mine for i in vms[v].gpus}
                for node in self.snapshot.nodes:
                    if node.state != "ready" or node.tenant not in (
                        None,
                        self.demands[p.demand].tenant,
                    ):
                        continue
                    for block in partition_table(nodes[node.name], fabric):
                        if (
                            len(block) == len(p.gpus)
                            and not set(block) & set(node.failed_gpus)
                            and all((node.name, i) in holders for i in block)
                        ):
                            problems.append(
                                f"claim {p.demand} reclaims {others} while borrowers of {rid} "
                                f"alone hold {node.name} {block}"
                            )
            gone |= set(p.preempts)
        return problems

    def _held(self) -> list[str]:
        """Rule 4: no held VM is preempted, so no tenant is taken below min(N, H), H what it
        runs outside borrowed capacity; and a claim right after the plan would reclaim no VM
        held inside a reservation then."""
        problems = []
        preempted = {p.vm: p.for_demand for p in self.plan.preemptions}
        for vm_id, rid in self.held.items():
            if vm_id in preempted:
                problems.append(
                    f"{rid}: {vm_id} is held inside it, yet preempted for {preempted[vm_id]}"
                )
        for rid, r in self.reservations.items():
            # What the tenant runs outside capacity borrowed from another reservation.
            own = [
                vm
                for vm in self.snapshot.vms
                if vm.tenant == r.tenant and vm.state == "running" and vm.id not in self.borrowers
            ]
            before = sum(len(vm.gpus) for vm in own)
            left = before - sum(len(vm.gpus) for vm in own if vm.id in preempted)
            if left < min(self.honoured[rid], before):
                problems.append(f"{rid}: tenant {r.tenant} taken from {before} to {left} GPUs")
        after = [vm for vm in self.snapshot.vms if vm.id not in preempted]
        now = self.snapshot.now
        for p in self.plan.placements:
            demand = self.demands[p.demand]
            after.append(
                Vm(
                    p.demand,
                    demand.pool,
                    p.node,
                    p.gpus,
                    now or demand.requested_at,
                    tenant=demand.tenant,
                    borrowed=p.borrowed,
                    reservation=p.reservation,
                )
            )
        lenders = {
            vm.id
            for vm in after
            if vm.borrowed in self.reservations
            and vm.state == "running"
            and self.kinds[vm.pool] == "spot"
            and vm.tenant != self.reservations[vm.borrowed].tenant
        }
        held_after = held_inside(list(self.reservations.values()), self.honoured, after, lenders)
        for rid, report in self.reports.items():
            for vm_id in report.claim_reclaims:
                if vm_id in held_after:
                    problems.append(
                        f"{rid}: a claim would reclaim {vm_id}, held inside "
                        f"{held_after[vm_id]} after the plan"
                    )
        return problems

    def _held_before(self, tenant: str) -> int:
        return sum(
            len(vm.gpus)
            for vm in self.snapshot.vms
            if vm.tenant == tenant and vm.state == "running"
        )

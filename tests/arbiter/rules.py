"""An independent referee for DESIGN.md section 3: every way a plan can break a rule.

It replays the plan on a plain model of the fleet (sets of GPU indices, no bit masks, no heaps)
and returns one line per broken rule, so property tests can assert an empty list and show what
went wrong when it is not.
"""

from __future__ import annotations

from datetime import timedelta

from gpucap.arbiter.model import Plan, Snapshot
from gpucap.arbiter.topology import partition_table
from tests.arbiter.reserved import Reserved


def rule_violations(snapshot: Snapshot, plan: Plan) -> list[str]:
    fabric = snapshot.capacity_set.fabric
    problems: list[str] = []
    pools = {pool.name: pool for pool in snapshot.pools}
    nodes = {node.name: node for node in snapshot.nodes}
    vms = {vm.id: vm for vm in snapshot.vms}
    demands = {demand.id: demand for demand in snapshot.demands}
    deployments = {d.name: d for d in snapshot.deployments}
    # Reservations (issue 19): a claim reclaiming its own borrowers is exempt from rules 2, 3
    # and 3a, and kept capacity is no free capacity for whom may not use it (rule 6); no VM
    # held inside a reservation is a victim of anyone (checked with the rest in reserved.py).
    reserved = Reserved(snapshot, plan)

    # Who holds each GPU before the plan.
    holder: dict[tuple[str, int], str] = {}
    for vm in snapshot.vms:
        for index in vm.gpus:
            holder[(vm.node, index)] = vm.id

    # Every demand is either placed or unsatisfied, exactly once.
    placed_ids = [p.demand for p in plan.placements]
    unsatisfied_ids = [u.demand for u in plan.unsatisfied]
    if sorted(placed_ids + unsatisfied_ids) != sorted(demands):
        problems.append("demands placed + unsatisfied differ from the snapshot's demands")
    if plan.complete != (not plan.unsatisfied):
        problems.append("complete disagrees with unsatisfied")

    # Rule 4: groups whole or not at all.
    placed_set = set(placed_ids)
    groups: dict[str, list[str]] = {}
    for d in snapshot.demands:
        groups.setdefault(d.group, []).append(d.id)
    for group, members in groups.items():
        count = sum(1 for m in members if m in placed_set)
        if count not in (0, len(members)):
            problems.append(f"group {group} placed partially ({count} of {len(members)})")

    # Victims: rules 1, 3 and the notified extension.
    preempted: dict[str, str] = {}
    for p in plan.preemptions:
        victim = vms.get(p.vm)
        if victim is None:
            problems.append(f"preemption of unknown VM {p.vm}")
            continue
        if p.vm in preempted:
            problems.append(f"VM {p.vm} preempted twice")
        preempted[p.vm] = p.for_demand
        exempt = reserved.exempt(p)
        if (p.pool, p.node, tuple(p.gpus)) != (victim.pool, victim.node, victim.gpus):
            problems.append(f"preemption of {p.vm} misstates pool, node or GPUs")
        if p.tenant != victim.tenant:
            problems.append(f"preemption of {p.vm} misstates the tenant")
        if pools[victim.pool].kind == "on_demand":
            problems.append(f"rule 1: on-demand VM {p.vm} preempted")
        if victim.state == "notified":
            problems.append(f"notified VM {p.vm} preempted again")
        protect = timedelta(seconds=pools[victim.pool].protect_seconds)
        if not exempt and snapshot.now is not None and snapshot.now < victim.started_at + protect:
            problems.append(
                f"rule 3a: {p.vm} preempted while its pool {victim.pool} protects it "
                f"(until {victim.started_at + protect})"
            )
        served = demands.get(p.for_demand)
        if served is None:
            problems.append(f"preemption of {p.vm} serves unknown demand {p.for_demand}")
            continue
        if not exempt and pools[victim.pool].rank <= pools[served.pool].rank:
            problems.append(
                f"rule 3: {p.vm} of {victim.pool} (rank {pools[victim.pool].rank}) preempted "
                f"for {served.id} of {served.pool} (rank {pools[served.pool].rank})"
            )
        if not p.reason:
            problems.append(f"preemption of {p.vm} has no reason")
        owner = nodes[victim.node].tenant if victim.node in nodes else None
        if owner is not None and served.tenant != owner:
            problems.append(
                f"dedicated node: {p.vm} on {victim.node} (tenant {owner}) preempted for "
                f"{served.id} of tenant {served.tenant}"
            )
        if owner is not None and victim.tenant != owner:
            problems.append(
                f"dedicated node: {p.vm} of tenant {victim.tenant} on {victim.node} (tenant "
                f"{owner}) preempted; the arbiter leaves other tenants' VMs there alone"
            )

    # Running jobs are reclaimed whole or not at all.
    jobs: dict[str, list[str]] = {}
    for vm in snapshot.vms:
        if vm.group is not None and vm.state == "running":
            jobs.setdefault(vm.group, []).append(vm.id)
    for job, members in jobs.items():
        stopped = [m for m in members if m in preempted]
        if stopped and len(stopped) != len(members):
            problems.append(
                f"job {job} partly reclaimed: {len(stopped)} of its {len(members)} running VMs"
            )
        elif len({preempted[m] for m in stopped}) > 1:
            problems.append(f"job {job} reclaimed for several demands")

    # Rule 2: floors and min_replicas, counted over the whole plan.
    held = dict.fromkeys(pools, 0)
    replicas = dict.fromkeys(deployments, 0)
    for vm in snapshot.vms:
        if vm.state == "running":
            held[vm.pool] += len(vm.gpus)
            if vm.deployment:
                replicas[vm.deployment] += 1
    taken = dict.fromkeys(pools, 0)
    replicas_taken = dict.fromkeys(deployments, 0)
    broken: set[str] = set()
    counted: set[str] = set()
    for p in plan.preemptions:
        vm = vms.get(p.vm)
        if vm is None or p.vm in counted:
            continue
        counted.add(p.vm)
        taken[vm.pool] += len(vm.gpus)
        if vm.deployment:
            replicas_taken[vm.deployment] += 1
        # Each preemption that is not exempt leaves its pool at or above the floor, counting
        # every earlier one (without exemptions: the whole plan's).
        floor = pools[vm.pool].floor_gpus
        if not reserved.exempt(p) and held[vm.pool] - taken[vm.pool] < floor:
            broken.add(vm.pool)
    for name in sorted(broken):
        problems.append(
            f"rule 2: pool {name} taken from {held[name]} to {held[name] - taken[name]}, "
            f"floor {pools[name].floor_gpus}"
        )
    for name, deployment in deployments.items():
        left = replicas[name] - replicas_taken[name]
        if replicas_taken[name] and left < deployment.min_replicas:
            problems.append(f"rule 2: deployment {name} down to {left} replicas")

    # Replay placements in order: topology (rule 5), free-first (rule 6), no GPU given twice,
    # and every preemption serves a placement that takes one of the victim's GPUs (rule 4).
    free = {
        (node.name, index)
        for node in snapshot.nodes
        for index in range(node.gpus)
        if (node.name, index) not in holder
    }
    given: set[tuple[str, int]] = set()
    served_victims: set[str] = set()
    for placement in plan.placements:
        demand = demands.get(placement.demand)
        node = nodes.get(placement.node)
        if demand is None or node is None:
            problems.append(f"placement {placement} names unknown demand or node")
            continue
        gpus = tuple(placement.gpus)
        if node.state != "ready":
            problems.append(f"placement of {demand.id} on {node.name}, which is {node.state}")
        if node.tenant is not None and demand.tenant != node.tenant:
            problems.append(
                f"dedicated node: {demand.id} of tenant {demand.tenant} placed on {node.name}, "
                f"dedicated to {node.tenant}"
            )
        if len(gpus) != demand.gpus:
            problems.append(f"placement of {demand.id} has {len(gpus)} GPUs, wants {demand.gpus}")
        if gpus not in partition_table(node, fabric):
            problems.append(f"rule 5: {demand.id} given {gpus}, not a partition of {node.name}")
        if set(gpus) & set(node.failed_gpus):
            problems.append(f"{demand.id} given a failed GPU on {node.name}")
        if placement.preempts and _free_block_exists(
            snapshot,
            node_free=free - reserved.off_limits(placement),
            size=demand.gpus,
            tenant=demand.tenant,
        ):
            problems.append(f"rule 6: {demand.id} preempts while a free partition exists")
        for vm_id in placement.preempts:
            if preempted.get(vm_id) != demand.id:
                problems.append(f"placement of {demand.id} lists {vm_id}, not preempted for it")
                continue
            vm = vms[vm_id]
            in_block = vm.node == node.name and bool(set(vm.gpus) & set(gpus))
            # ... or reclaimed with its running job, a member of which is in the block.
            with_job = vm.group is not None and any(
                vms[other].group == vm.group
                and vms[other].node == node.name
                and set(vms[other].gpus) & set(gpus)
                for other in placement.preempts
                if other in vms
            )
            if not (in_block or with_job):
                problems.append(f"rule 4: {vm_id} preempted but not in {demand.id}'s block")
            served_victims.add(vm_id)
            free |= {(vm.node, index) for index in vm.gpus}
        for index in gpus:
            key = (node.name, index)
            if key in given:
                problems.append(f"GPU {index} of {node.name} given twice")
            elif key not in free:
                owner = holder.get(key)
                problems.append(
                    f"{demand.id} given GPU {index} of {node.name}, held by {owner or 'nobody?'}"
                )
            given.add(key)
            free.discard(key)
    for vm_id in preempted:
        if vm_id not in served_victims:
            problems.append(f"rule 4: preemption of {vm_id} serves no placement")

    # Pool balances.
    placed_gpus = dict.fromkeys(pools, 0)
    for placement in plan.placements:
        placed_gpus[demands[placement.demand].pool] += len(placement.gpus)
    expected = [
        (p.name, held[p.name], held[p.name] - taken[p.name] + placed_gpus[p.name], p.floor_gpus)
        for p in sorted(snapshot.pools, key=lambda pool: pool.rank)
    ]
    actual = [(b.name, b.before_gpus, b.after_gpus, b.floor_gpus) for b in plan.pools]
    if actual != expected:
        problems.append(f"pool balances {actual} != {expected}")
    problems += _quota_violations(snapshot, plan)
    problems += reserved.violations()
    return problems


def _quota_violations(snapshot: Snapshot, plan: Plan) -> list[str]:
    """No plan places past a quota: where it places anything of a tenant in a quota's scope,
    the tenant's running and notified VMs there plus the plan's placements fit the quota."""
    demands = {demand.id: demand for demand in snapshot.demands}
    problems = []
    for quota in snapshot.quotas:

        def in_scope(tenant, pool, quota=quota):
            return tenant == quota.tenant and quota.pool in (None, pool)

        held = sum(len(vm.gpus) for vm in snapshot.vms if in_scope(vm.tenant, vm.pool))
        placed = sum(
            len(p.gpus)
            for p in plan.placements
            if in_scope(demands[p.demand].tenant, demands[p.demand].pool)
        )
        if placed and held + placed > quota.max_gpus:
            problems.append(
                f"quota: tenant {quota.tenant} in {quota.pool or 'the set'} may hold "
                f"{quota.max_gpus}, holds {held} and the plan places {placed} more"
            )
    return problems


def _free_block_exists(
    snapshot: Snapshot, *, node_free: set, size: int, tenant: str | None = None
) -> bool:
    """Whether a ready node that a demand of ``tenant`` may use has a free partition of
    ``size`` (nodes dedicated to other tenants are not its free capacity)."""
    fabric = snapshot.capacity_set.fabric
    for node in snapshot.nodes:
        if node.state != "ready" or node.tenant not in (None, tenant):
            continue
        for block in partition_table(node, fabric):
            if len(block) != size or set(block) & set(node.failed_gpus):
                continue
            if all((node.name, index) in node_free for index in block):
                return True
    return False

"""Exhaustive search over every legal way to serve demand groups, for small capacity sets.

The planner picks reclaims through indexes, heaps and a branch-and-bound search; this module
tries every (node, partition) for every demand in every order instead, on a plain model of the
fleet, so tests can compare the planner's disruption to the true minimum. It follows the same
rules (DESIGN.md section 3), checked step by step as the referee in `rules` replays a plan, and
the same rule-7 cost (`disruption_cost`), and is only fast enough for a handful of nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

from gpucap.arbiter.model import Demand, Snapshot, Vm
from gpucap.arbiter.planner import disruption_cost
from gpucap.arbiter.topology import partition_table


@dataclass(frozen=True)
class Fleet:
    """What the oracle tracks: GPUs taken by the plan, VMs still running, pool and deployment
    headroom."""

    taken: frozenset[tuple[str, int]]
    running: frozenset[str]
    held: tuple[tuple[str, int], ...]
    replicas: tuple[tuple[str, int], ...]


class Oracle:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.fabric = snapshot.capacity_set.fabric
        self.pools = {pool.name: pool for pool in snapshot.pools}
        self.rank = {pool.name: pool.rank for pool in snapshot.pools}
        self.vms = {vm.id: vm for vm in snapshot.vms}
        self.min_replicas = {d.name: d.min_replicas for d in snapshot.deployments}
        self.jobs: dict[str, list[str]] = {}
        for vm in snapshot.vms:
            if vm.group is not None and vm.state == "running":
                self.jobs.setdefault(vm.group, []).append(vm.id)
        self.holder: dict[tuple[str, int], str] = {}
        for vm in snapshot.vms:
            for index in vm.gpus:
                self.holder[(vm.node, index)] = vm.id
        self.blocks = {
            node.name: [
                block
                for block in partition_table(node, self.fabric)
                if not set(block) & set(node.failed_gpus)
            ]
            for node in snapshot.nodes
            if node.state == "ready"
        }

    def start(self) -> Fleet:
        held: dict[str, int] = dict.fromkeys(self.pools, 0)
        replicas: dict[str, int] = dict.fromkeys(self.min_replicas, 0)
        for vm in self.snapshot.vms:
            if vm.state == "running":
                held[vm.pool] += len(vm.gpus)
                if vm.deployment:
                    replicas[vm.deployment] += 1
        return Fleet(
            taken=frozenset(),
            running=frozenset(vm.id for vm in self.snapshot.vms),
            held=tuple(sorted(held.items())),
            replicas=tuple(sorted(replicas.items())),
        )

    def group_placements(
        self, fleet: Fleet, demands: list[Demand]
    ) -> list[tuple[Fleet, tuple[str, ...], tuple[tuple[str, tuple[int, ...]], ...]]]:
        """Every legal way to place the whole group: (fleet after, victims, blocks). When the
        group fits on free capacity alone, only those ways (rule 6)."""
        free_only = list(self._assign(fleet, demands, (), (), allow_reclaim=False))
        if free_only:
            return free_only
        return list(self._sequences(fleet, demands, (), ()))

    def _assign(
        self,
        fleet: Fleet,
        demands: list[Demand],
        victims: tuple[str, ...],
        blocks: tuple,
        *,
        allow_reclaim: bool,
    ) -> Iterator[tuple[Fleet, tuple[str, ...], tuple]]:
        if not demands:
            yield fleet, victims, blocks
            return
        demand, rest = demands[0], demands[1:]
        for node, node_blocks in sorted(self.blocks.items()):
            for block in node_blocks:
                if len(block) != demand.gpus:
                    continue
                after = self._take(fleet, demand, node, block, allow_reclaim)
                if after is None:
                    continue
                new_fleet, new_victims = after
                yield from self._assign(
                    new_fleet,
                    rest,
                    victims + new_victims,
                    (*blocks, (node, block)),
                    allow_reclaim=allow_reclaim,
                )

    def _sequences(
        self, fleet: Fleet, demands: list[Demand], victims: tuple[str, ...], blocks: tuple
    ) -> Iterator[tuple[Fleet, tuple[str, ...], tuple]]:
        """Every legal sequence of steps that places the group with reclaims, its demands in
        any order. Each step is checked when it happens, as the referee replays a plan: a
        reclaim preempts only VMs the demand making it may preempt (rules 1 and 3), keeps
        every floor (rule 2), and happens only when no partition of its size is free at that
        moment (rule 6); a step may use GPUs an earlier step's victims freed."""
        if not demands:
            yield fleet, victims, blocks
            return
        tried = set()
        for position, demand in enumerate(demands):
            kind = (demand.gpus, self.rank[demand.pool])
            if kind in tried:
                continue  # demands alike in size and rank place alike
            tried.add(kind)
            rest = demands[:position] + demands[position + 1 :]
            free_now = self._free_block_exists(fleet, demand.gpus)
            for node, node_blocks in sorted(self.blocks.items()):
                for block in node_blocks:
                    if len(block) != demand.gpus:
                        continue
                    after = self._take(fleet, demand, node, block, allow_reclaim=True)
                    if after is None or (after[1] and free_now):
                        continue
                    new_fleet, new_victims = after
                    yield from self._sequences(
                        new_fleet, rest, victims + new_victims, (*blocks, (node, block))
                    )

    def _free_block_exists(self, fleet: Fleet, size: int) -> bool:
        return any(
            len(block) == size
            and not any(
                (node, index) in fleet.taken or self.holder.get((node, index)) in fleet.running
                for index in block
            )
            for node, node_blocks in self.blocks.items()
            for block in node_blocks
        )

    def _take(
        self, fleet: Fleet, demand: Demand, node: str, block: tuple[int, ...], allow_reclaim: bool
    ) -> tuple[Fleet, tuple[str, ...]] | None:
        keys = [(node, index) for index in block]
        if any(key in fleet.taken for key in keys):
            return None
        occupants = sorted(
            {
                self.holder[key]
                for key in keys
                if key in self.holder and self.holder[key] in fleet.running
            }
        )
        if occupants and not allow_reclaim:
            return None
        # A running job is reclaimed whole: every running member, wherever it runs.
        occupants = sorted(
            set(occupants).union(
                *(
                    [m for m in self.jobs[self.vms[v].group] if m in fleet.running]
                    for v in occupants
                    if self.vms[v].group in self.jobs
                )
            )
        )
        held = dict(fleet.held)
        replicas = dict(fleet.replicas)
        for vm_id in occupants:
            vm = self.vms[vm_id]
            if not self._may_preempt(vm, demand):
                return None
            held[vm.pool] -= len(vm.gpus)
            if held[vm.pool] < self.pools[vm.pool].floor_gpus:
                return None
            if vm.deployment:
                replicas[vm.deployment] -= 1
                if replicas[vm.deployment] < self.min_replicas[vm.deployment]:
                    return None
        return (
            Fleet(
                taken=fleet.taken | frozenset(keys),
                running=fleet.running - frozenset(occupants),
                held=tuple(sorted(held.items())),
                replicas=tuple(sorted(replicas.items())),
            ),
            tuple(occupants),
        )

    def _may_preempt(self, vm: Vm, demand: Demand) -> bool:
        return (
            vm.state == "running"
            and self.pools[vm.pool].kind != "on_demand"
            and self.rank[vm.pool] > self.rank[demand.pool]
            and not self._protected(vm)
        )

    def _protected(self, vm: Vm) -> bool:
        """Rule 3a: inside its pool's protection window at the snapshot's now."""
        now = self.snapshot.now
        protect = timedelta(seconds=self.pools[vm.pool].protect_seconds)
        return now is not None and now < vm.started_at + protect

    def cost(self, victims: tuple[str, ...]) -> tuple[int, ...]:
        return disruption_cost([self.vms[v] for v in victims], self.rank)

    def preempted_gpus(self, victims: tuple[str, ...]) -> int:
        return sum(len(self.vms[v].gpus) for v in victims)


def service_order(snapshot: Snapshot) -> list[tuple[str, list[Demand]]]:
    """Groups in the order of rule 8, demands inside largest first, as the planner serves them."""
    rank = {pool.name: pool.rank for pool in snapshot.pools}
    groups: dict[str, list[Demand]] = {}
    for demand in snapshot.demands:
        groups.setdefault(demand.group, []).append(demand)
    ordered = sorted(
        groups.items(),
        key=lambda item: (
            min(rank[d.pool] for d in item[1]),
            min(d.requested_at for d in item[1]),
            item[0],
        ),
    )
    return [
        (group, sorted(demands, key=lambda d: (-d.gpus, d.requested_at, d.id)))
        for group, demands in ordered
    ]


def cheapest_group_placement(snapshot: Snapshot) -> tuple | None:
    """For a snapshot with one group: the least disruptive legal placement's
    (cost, sorted nodes, sorted victims), () if it fits on free capacity, None if impossible."""
    oracle = Oracle(snapshot)
    ((_, demands),) = service_order(snapshot)
    options = oracle.group_placements(oracle.start(), demands)
    if not options:
        return None
    best = None
    for _, victims, _blocks in options:
        if not victims:
            return ()
        victim_nodes = tuple(sorted({oracle.vms[v].node for v in victims}))
        key = (oracle.cost(victims), victim_nodes, tuple(sorted(victims)))
        if best is None or key < best:
            best = key
    return best


def fewest_preempted_gpus(snapshot: Snapshot, satisfied_at_least: int) -> int | None:
    """Over every plan that serves the groups in order and places each group whenever some
    legal placement exists: the fewest preempted GPUs among plans satisfying at least
    ``satisfied_at_least`` groups (None if no such plan)."""
    oracle = Oracle(snapshot)
    groups = service_order(snapshot)
    memo: dict[tuple[int, Fleet], dict[int, int]] = {}

    def best_from(position: int, fleet: Fleet) -> dict[int, int]:
        """satisfied groups from here on -> fewest preempted GPUs from here on."""
        if position == len(groups):
            return {0: 0}
        key = (position, fleet)
        if key in memo:
            return memo[key]
        options = oracle.group_placements(fleet, groups[position][1])
        results: dict[int, int] = {}
        if not options:
            results = dict(best_from(position + 1, fleet))
        seen: set[Fleet] = set()
        for after, victims, _ in options:
            if after in seen:
                continue
            seen.add(after)
            cost = oracle.preempted_gpus(victims)
            for satisfied, rest in best_from(position + 1, after).items():
                total = cost + rest
                if total < results.get(satisfied + 1, total + 1):
                    results[satisfied + 1] = total
        memo[key] = results
        return results

    outcomes = best_from(0, oracle.start())
    costs = [cost for satisfied, cost in outcomes.items() if satisfied >= satisfied_at_least]
    return min(costs) if costs else None

"""An exact reference for rule 7 over a whole plan: an integer program solved with HiGHS.

Given a snapshot and the demand groups a plan served, `least_disruption` finds the least
disruptive legal way to serve exactly those groups, jointly, whatever the order of service:

- every demand of those groups gets one partition of its size from its node's own table, on a
  ready node, with no failed GPU, no GPU of an on-demand or notified VM, and no GPU twice;
- a VM holding a GPU of a taken partition is preempted (its other GPUs become free capacity);
- a victim is legal when it ranks strictly below at least one placement that takes one of its
  GPUs (rules 1, 3 and DESIGN's reading of rule 4: on-demand and notified VMs never) and is
  not protected (rule 3a, docs/arbiter.md);
- floors and ``min_replicas`` hold over the whole plan (rule 2).

Rule 6 (free capacity first, per group) and the order of service (rule 8) are relaxed: the
program may preempt although a partition of that size is free, and may serve a later group
before an earlier one. Both only enlarge the set of plans it minimises over, so its optimum is
at most the best plan the planner could legally make: the comparison is stricter, never looser.

The disruption of a set of victims is the planner's rule-7 order (`planner.disruption_cost`)
taken over all the plan's victims (rule 8: "rule 7 is judged over the whole plan"): first the
most important pool touched, as unimportant as possible; then fewest preempted GPUs; then fewest
preempted VMs; then least progress lost (sum of the victims' running times). `Disruption` holds
those four numbers and `scalar` turns them into one number that keeps that order (see there).
The program is solved lexicographically: the least important level of victims that admits a
plan first, then GPUs and VMs (one integer objective, ``(G + 1) x GPUs + VMs``), then
progress lost with the first two fixed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import highspy
import numpy as np

from gpucap.arbiter.model import Plan, Snapshot, Vm
from gpucap.arbiter.topology import partition_table

# A level's scalar stays below (set's GPUs + 1) <= 513 for sets of up to 64 x 8 GPUs, so one
# GPU of a more important pool outweighs any disruption of less important pools.
LEVEL_BASE = 1024


@dataclass(frozen=True)
class Disruption:
    """Rule 7's order over a whole plan: smaller `key` is less disruptive."""

    top_rank: int | None  # the most important pool touched (smallest rank); None: no victim
    gpus: int
    vms: int
    seconds_lost: float  # sum over victims of (now - started_at)

    @property
    def key(self) -> tuple:
        if self.top_rank is None:
            return (0, 0, 0, 0.0)
        return (-self.top_rank, self.gpus, self.vms, self.seconds_lost)


def disruption_of(snapshot: Snapshot, victims: list[Vm]) -> Disruption:
    if not victims:
        return Disruption(None, 0, 0, 0.0)
    rank = {pool.name: pool.rank for pool in snapshot.pools}
    return Disruption(
        top_rank=min(rank[vm.pool] for vm in victims),
        gpus=sum(len(vm.gpus) for vm in victims),
        vms=len(victims),
        seconds_lost=sum((snapshot.now - vm.started_at).total_seconds() for vm in victims),
    )


def plan_disruption(snapshot: Snapshot, plan: Plan) -> Disruption:
    vms = {vm.id: vm for vm in snapshot.vms}
    return disruption_of(snapshot, [vms[p.vm] for p in plan.preemptions])


def scalar(snapshot: Snapshot, disruption: Disruption) -> float:
    """One number in rule 7's order: ``W(top) x (GPUs + (VMs + lost) / (G + 1))``.

    ``top`` is the rank of the most important pool touched and ``W(rank) = 1024 ** (lowest
    rank - rank)``; ``G`` is the set's GPU count (at most 512 here), so the bracket stays below
    G + 1 < 1024 and touching a more important pool always costs more than any disruption that
    touches only less important ones. Within a level one more GPU costs more than any number of
    VMs (at most G), and one more VM more than any progress lost: ``lost`` is the victims'
    running time as a fraction in [0, 1) (seconds lost over (VM count x longest running time +
    1)). No victim is 0."""
    if disruption.top_rank is None:
        return 0.0
    total_gpus = sum(node.gpus for node in snapshot.nodes)
    lowest = max(pool.rank for pool in snapshot.pools)
    longest = max((snapshot.now - vm.started_at).total_seconds() for vm in snapshot.vms)
    lost = disruption.seconds_lost / (len(snapshot.vms) * longest + 1)
    weight = float(LEVEL_BASE ** (lowest - disruption.top_rank))
    return weight * (disruption.gpus + (disruption.vms + lost) / (total_gpus + 1))


@dataclass(frozen=True)
class _Option:
    """One partition a kind of demand could take, and the VMs it would preempt."""

    column: int
    node: str
    gpus: tuple[int, ...]
    occupants: tuple[int, ...]  # victim columns


class _Program:
    """The integer program of one snapshot and set of served groups (see module docs)."""

    def __init__(self, snapshot: Snapshot, groups: set[str]) -> None:
        self.snapshot = snapshot
        fabric = snapshot.capacity_set.fabric
        pools = {pool.name: pool for pool in snapshot.pools}
        rank = {name: pool.rank for name, pool in pools.items()}
        # Demands alike in size and rank place alike: one kind, placed `count` times.
        kinds: dict[tuple[int, int], int] = {}
        for demand in snapshot.demands:
            if demand.group in groups:
                kind = (demand.gpus, rank[demand.pool])
                kinds[kind] = kinds.get(kind, 0) + 1
        self.kinds = kinds
        holder: dict[tuple[str, int], Vm] = {}
        for vm in snapshot.vms:
            for index in vm.gpus:
                holder[(vm.node, index)] = vm
        # Victim columns: the VMs a plan may preempt at all.
        self.victims = [vm for vm in snapshot.vms if self._may_preempt(vm, pools)]
        victim_column = {vm.id: column for column, vm in enumerate(self.victims)}
        columns = len(self.victims)
        self.options: dict[tuple[int, int], list[_Option]] = {}
        for kind in sorted(kinds):
            size = kind[0]
            options = []
            for node in sorted(snapshot.nodes, key=lambda node: node.name):
                if node.state != "ready":
                    continue
                for block in partition_table(node, fabric):
                    if len(block) != size or set(block) & set(node.failed_gpus):
                        continue
                    occupants = {holder[(node.name, i)] for i in block if (node.name, i) in holder}
                    if any(vm.id not in victim_column for vm in occupants):
                        continue  # an on-demand or notified VM's GPU: never free
                    # A partition whose every occupant outranks the demand may still be taken
                    # after a higher-ranked placement preempted them: keep it.
                    options.append(
                        _Option(
                            column=columns,
                            node=node.name,
                            gpus=block,
                            occupants=tuple(sorted(victim_column[vm.id] for vm in occupants)),
                        )
                    )
                    columns += 1
            self.options[kind] = options
        self.columns = columns
        self.rows: list[tuple[float, float, list[int], list[float]]] = []
        self._constraints(pools, rank)

    def _may_preempt(self, vm: Vm, pools: dict) -> bool:
        """Per-victim legality: running (not notified), not on-demand, and not protected (rule
        3a: started or resumed less than its pool's protect_seconds before the snapshot's now).
        A VM that fails it has no column, so a partition holding it is never taken."""
        return (
            vm.state == "running"
            and pools[vm.pool].kind != "on_demand"
            and not _protected(vm, pools[vm.pool], self.snapshot.now)
        )

    def _constraints(self, pools: dict, rank: dict[str, int]) -> None:
        infinity = highspy.kHighsInf
        rows = self.rows
        covering: dict[tuple[str, int], list[int]] = {}
        overlapping: dict[int, list[tuple[int, int]]] = {}  # victim -> (option column, rank)
        for kind, options in self.options.items():
            count = self.kinds[kind]
            rows.append((count, count, [o.column for o in options], [1.0] * len(options)))
            for option in options:
                for index in option.gpus:
                    covering.setdefault((option.node, index), []).append(option.column)
                for victim in option.occupants:
                    # Taking the partition preempts every VM on it.
                    rows.append((-infinity, 0.0, [option.column, victim], [1.0, -1.0]))
                    overlapping.setdefault(victim, []).append((option.column, kind[1]))
        for columns in covering.values():
            if len(columns) > 1:
                rows.append((-infinity, 1.0, columns, [1.0] * len(columns)))
        # A victim is legal only under a placement ranked above it that takes one of its GPUs.
        self.fixed_out: list[int] = []
        for column, vm in enumerate(self.victims):
            above = [option for option, r in overlapping.get(column, ()) if r < rank[vm.pool]]
            if not above:
                self.fixed_out.append(column)
                continue
            rows.append((-infinity, 0.0, [column, *above], [1.0] + [-1.0] * len(above)))
        # (Victims that come in whole groups, e.g. a multi-VM job, would be one equality row
        # per pair of group-mates, (0, 0, [a, b], [1.0, -1.0]), so preempting one preempts
        # all; and the legality row above taken per group, over the placements on any mate's
        # GPUs, since a mate on another node is preempted with no placement on its GPUs.)
        # Floors and min_replicas, over the whole plan.
        held = dict.fromkeys(pools, 0)
        replicas: dict[str, int] = {}
        for vm in self.snapshot.vms:
            if vm.state == "running":
                held[vm.pool] += len(vm.gpus)
                if vm.deployment:
                    replicas[vm.deployment] = replicas.get(vm.deployment, 0) + 1
        for name, pool in pools.items():
            members = [c for c, vm in enumerate(self.victims) if vm.pool == name]
            if members:
                weights = [float(len(self.victims[c].gpus)) for c in members]
                headroom = float(max(0, held[name] - pool.floor_gpus))
                rows.append((-infinity, headroom, members, weights))
        for deployment in self.snapshot.deployments:
            members = [c for c, vm in enumerate(self.victims) if vm.deployment == deployment.name]
            if members:
                headroom = max(0, replicas.get(deployment.name, 0) - deployment.min_replicas)
                rows.append((-infinity, float(headroom), members, [1.0] * len(members)))

    def solve(self) -> Disruption | None:
        """The least disruption of a plan serving exactly the groups, None if none exists.

        Lexicographic: the first level that admits a plan (no victim at all; victims from the
        lowest-ranked pool only; from the two lowest; ...) fixes the most important pool
        touched; then the fewest GPUs, then VMs (one integer objective, ``(G + 1) x GPUs +
        VMs``); then, with that optimum kept as a constraint, the least progress lost."""
        snapshot = self.snapshot
        if any(not options for options in self.options.values()):
            return None  # a demand with no partition of its size anywhere
        if not self.options:
            return disruption_of(snapshot, [])
        rank = {pool.name: pool.rank for pool in snapshot.pools}
        levels = sorted({rank[vm.pool] for vm in self.victims}, reverse=True)
        total_gpus = sum(node.gpus for node in snapshot.nodes)
        gpus_and_vms = np.zeros(self.columns)
        lost = np.zeros(self.columns)
        for column, vm in enumerate(self.victims):
            gpus_and_vms[column] = (total_gpus + 1) * len(vm.gpus) + 1
            lost[column] = (snapshot.now - vm.started_at).total_seconds()
        for lowest_allowed in [None, *levels]:
            allowed = np.zeros(self.columns, dtype=bool)
            allowed[len(self.victims) :] = True
            if lowest_allowed is not None:
                for column, vm in enumerate(self.victims):
                    allowed[column] = rank[vm.pool] >= lowest_allowed
            allowed[self.fixed_out] = False
            first = self._minimise(gpus_and_vms, allowed, [])
            if first is None:
                continue
            value, solution = first
            if lowest_allowed is not None:
                second = self._minimise(lost, allowed, [(gpus_and_vms, round(value))])
                assert second is not None
                solution = second[1]
            chosen = [vm for c, vm in enumerate(self.victims) if solution[c] > 0.5]
            found = disruption_of(snapshot, chosen)
            assert found.top_rank == lowest_allowed, (found, lowest_allowed)
            return found
        return None

    def _minimise(
        self, cost: np.ndarray, allowed: np.ndarray, caps: list[tuple[np.ndarray, float]]
    ) -> tuple[float, np.ndarray] | None:
        highs = highspy.Highs()
        highs.silent()
        highs.setOptionValue("mip_rel_gap", 0.0)
        highs.setOptionValue("mip_abs_gap", 0.0)
        highs.setOptionValue("threads", 1)
        count = self.columns
        upper = np.where(allowed, 1.0, 0.0)
        highs.addVars(count, np.zeros(count), upper)
        highs.changeColsCost(count, np.arange(count, dtype=np.int32), cost.astype(np.float64))
        highs.changeColsIntegrality(
            count,
            np.arange(count, dtype=np.int32),
            np.full(count, highspy.HighsVarType.kInteger),
        )
        rows = list(self.rows)
        for weights, limit in caps:
            # An earlier objective's optimum (an integer), kept.
            members = [int(c) for c in np.nonzero(weights)[0]]
            coefficients = [float(weights[c]) for c in members]
            rows.append((-highspy.kHighsInf, limit + 0.5, members, coefficients))
        lower = np.array([row[0] for row in rows], dtype=np.float64)
        upper_rows = np.array([row[1] for row in rows], dtype=np.float64)
        starts = np.zeros(len(rows), dtype=np.int32)
        indices: list[int] = []
        values: list[float] = []
        for position, (_, _, columns, coefficients) in enumerate(rows):
            starts[position] = len(indices)
            indices.extend(columns)
            values.extend(coefficients)
        highs.addRows(
            len(rows),
            lower,
            upper_rows,
            len(indices),
            starts,
            np.array(indices, dtype=np.int32),
            np.array(values, dtype=np.float64),
        )
        highs.run()
        status = highs.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            return None
        assert status == highspy.HighsModelStatus.kOptimal, highs.modelStatusToString(status)
        solution = np.array(highs.getSolution().col_value)
        return highs.getInfo().objective_function_value, solution


def _protected(vm: Vm, pool, now: datetime | None) -> bool:
    return (
        now is not None
        and pool.protect_seconds > 0
        and now < vm.started_at + timedelta(seconds=pool.protect_seconds)
    )


def least_disruption(snapshot: Snapshot, groups: set[str]) -> Disruption | None:
    """The least disruption (rule 7 over the whole plan) of any legal plan serving exactly the
    demands of ``groups`` (rule 6 and the order of service relaxed), None if there is none."""
    return _Program(snapshot, groups).solve()


def served_groups(snapshot: Snapshot, plan: Plan) -> set[str]:
    unsatisfied = {u.group for u in plan.unsatisfied}
    return {d.group for d in snapshot.demands} - unsatisfied

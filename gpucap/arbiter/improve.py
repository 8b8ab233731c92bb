"""Least disruption over the whole plan (rule 7 as rule 8 reads it), for small sets.

The planner serves groups one at a time (rule 8's order) and gives each its least disruptive
legal placement given what the earlier groups took. That can cost more over the whole plan than
needed: an earlier group takes the cheap reclaim a later group needed, or free capacity that
would have spared a later group a reclaim, and the later group then preempts more, or from a
more important pool; or a group takes eight GPUs of the lowest-ranked pool where two of a pool
the plan already touches would do (rule 7 for that group alone prefers the lower pool, but over
the whole plan the most important pool touched is the same and fewer GPUs go). Rule 8 says the
order of service decides who is served, not how badly: rule 7 is judged over the whole plan,
against the best legal plan serving the same demands.

`whole_plan` looks for such a plan by a large-neighbourhood search. Each candidate is the
planner itself, re-run with the groups served in another order and some running VMs "spared"
(illegal victims, like on-demand ones), so every candidate keeps every rule the planner keeps.
From the best plan so far it tries, in this order (`_moves`):

1. sparing every VM of the most important pool the plan touches and of the pools above it,
   in the same order of service and reversed: a plan that still serves the same demands
   touches only less important pools;
2. the order of service reversed (lowest-ranked groups first: they may reclaim from fewer
   pools);
3. per group that preempts from pools below the most important one touched (the most such
   GPUs first), and per pool rank L from that one down: sparing every VM ranked below L but
   the other groups' victims, so that this group reclaims from pool L where the whole plan
   allows it (rule 7 for the group alone prefers the lowest pool; over the plan, fewer GPUs
   of a pool already touched can be less disruptive);
4. sparing one group's victims (groups with the most preempted GPUs first);
5. each group moved to the front, then each moved to the back.

When a candidate stops serving some groups, it is retried once with those groups served
first.

It moves to the first candidate that is strictly less disruptive and serves exactly the same
demands, and starts again from there (spared VMs stay spared). A candidate serving other
demands is never taken, so who is served stays rule 8's answer; the unsatisfied demands and
their reasons are the first plan's (a candidate's reasons would blame spared VMs).

Disruption over a plan is `plan_cost`: the planner's rule-7 key (`planner.disruption_cost`)
over all the plan's victims. Only a strictly smaller key replaces a plan, so the first plan
wins every tie and the result is deterministic. The work is bounded without a clock (`_Work`): a
re-plan counts its set's ready nodes times its groups plus the search states it expanded, and a
plan gets `WORK_BUDGET` of that. The search runs on sets of up to
`MAX_READY_NODES` ready nodes whose first plan preempts; larger sets keep the planner's plan.

Measured against the exact optimum (tests/arbiter/test_exact_disruption.py, 400 random contested
sets of up to 64 nodes, 318 with victims): 1.0088x on average over the sets with victims
(NVSwitch 1.0197x, PCIe 1.0000x), 1.22x at worst; the reordering alone left three sets at
about 1,000x (a pool touched that the optimum spares) and 1.02x on average. With a budget ten
times larger the NVSwitch mean is 1.015x; the rest of the gap is in plans whose freed GPUs are
shared between groups in ways no order of service gives, or that break rule 6, which the
optimum relaxes (how much of it is rule 6 is not measured). Plan times on those sets (this
machine, shared): median 7-14 ms, p99 0.16-0.27 s, max 0.17-0.36 s (the planner alone: 2 ms,
0.07-0.11 s, 0.13-0.21 s: small PCIe sets searched whole); on the sets of 48-64 nodes at most
0.08-0.12 s (the reordering alone: up to 0.85 s).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from gpucap.arbiter.model import Plan, Snapshot

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

# Sets with more ready nodes keep the planner's plan (large sets must plan fast).
MAX_READY_NODES = 64
# The work a plan's search may do (see `_Work`): a re-plan counts ready nodes x groups plus the
# search states it expanded (a unit is about 20-60 µs here, so about 0.1-0.3 s in all).
WORK_BUDGET = 4000
MAX_REPLANS = 48

Replan = Callable[[list[str], frozenset[str]], tuple[Plan, int]]


def plan_cost(plan: Plan, rank: Mapping[str, int], started: Mapping[str, int]) -> tuple:
    """Rule 7 over the whole plan: (-(rank of the most important pool touched), preempted GPUs,
    preempted VMs, -(sum of the victims' start times)); smaller is less disruptive."""
    victims = plan.preemptions
    if not victims:
        return (0, 0, 0, 0)
    return (
        -min(rank[p.pool] for p in victims),
        sum(len(p.gpus) for p in victims),
        len(victims),
        -sum(started[p.vm] for p in victims),
    )


def whole_plan(
    snapshot: Snapshot,
    first: Plan,
    *,
    order: list[str],
    ready_nodes: int,
    states: int,
    replan: Replan,
) -> Plan:
    """The least disruptive plan found that serves the same demands as ``first`` (made with
    the groups in ``order``, expanding ``states`` search states), re-planning with
    ``replan(order, spared)`` (a plan and the search states it expanded); ``first`` itself
    when none is better."""
    if not first.preemptions or ready_nodes > MAX_READY_NODES:
        return first
    rank = {pool.name: pool.rank for pool in snapshot.pools}
    started = {vm.id: (vm.started_at - _EPOCH) // _MICROSECOND for vm in snapshot.vms}
    served = _served(first)
    group_of = {demand.id: demand.group for demand in snapshot.demands}
    best = (plan_cost(first, rank, started), first, order, frozenset())
    tried = {(tuple(order), frozenset[str]())}
    work = _Work(ready_nodes * len(order), states)
    improved = True
    while improved and work.left():
        improved = False
        for candidate, spared in _moves(snapshot, rank, best[1], best[2], best[3]):
            follow = [(candidate, spared, True)]
            while follow and work.left():
                candidate, spared, first_try = follow.pop()
                if (tuple(candidate), spared) in tried:
                    continue
                tried.add((tuple(candidate), spared))
                result, states = replan(candidate, spared)
                work.spend(states)
                if _served(result) != served:
                    # Groups the candidate no longer serves may fit if served first.
                    lost = sorted({group_of[d] for d in served - _served(result)})
                    if first_try and lost != candidate[: len(lost)]:
                        rest = [group for group in candidate if group not in lost]
                        follow.append(([*lost, *rest], spared, False))
                    continue
                cost = plan_cost(result, rank, started)
                if cost < best[0]:
                    best = (cost, result, candidate, spared)
                    improved = True
            if improved or not work.left():
                break
    if best[1] is first:
        return first
    return replace(best[1], unsatisfied=first.unsatisfied)


class _Work:
    """The search's work, counted without a clock: a re-plan costs its set's ready nodes times
    its groups plus the search states it expanded (each unit about 20-60 µs here). A re-plan
    is made only while the work so far plus the next one's, estimated as the largest re-plan
    so far (the first plan's before any), stays within `WORK_BUDGET`; `MAX_REPLANS` at most.
    So the work exceeds the budget by at most one re-plan's search (`planner._SEARCH_BUDGET`
    states per group)."""

    def __init__(self, per_replan: int, first_states: int) -> None:
        self.per_replan = per_replan
        self.next = per_replan + first_states
        self.spent = 0
        self.replans = 0

    def left(self) -> bool:
        return self.replans < MAX_REPLANS and self.spent + self.next <= WORK_BUDGET

    def spend(self, states: int) -> None:
        self.replans += 1
        self.spent += self.per_replan + states
        self.next = max(self.next if self.replans > 1 else 0, self.per_replan + states)


def _moves(
    snapshot: Snapshot,
    rank: Mapping[str, int],
    plan: Plan,
    order: list[str],
    spared: frozenset[str],
) -> Iterator[tuple[list[str], frozenset[str]]]:
    """The candidates around a plan, as (order of service, spared VM ids), in the order of
    the module docs."""
    victims = plan.preemptions
    top = min(rank[p.pool] for p in victims)
    level = spared | {vm.id for vm in snapshot.vms if rank[vm.pool] <= top}
    yield order, level
    yield order[::-1], level
    yield order[::-1], spared
    group_of = {demand.id: demand.group for demand in snapshot.demands}
    by_group: dict[str, list] = {}
    for preemption in victims:
        by_group.setdefault(group_of[preemption.for_demand], []).append(preemption)
    lower_gpus = {
        group: sum(len(p.gpus) for p in taken if rank[p.pool] > top)
        for group, taken in by_group.items()
    }
    levels = sorted({rank[vm.pool] for vm in snapshot.vms if rank[vm.pool] >= top})
    for group in sorted(by_group, key=lambda g: (-lower_gpus[g], g)):
        if not lower_gpus[group]:
            continue
        others = {p.vm for g, taken in by_group.items() if g != group for p in taken}
        for level in levels[:-1]:
            below = {vm.id for vm in snapshot.vms if rank[vm.pool] > level}
            yield order, spared | (below - others)
    for group in sorted(by_group, key=lambda g: (-sum(len(p.gpus) for p in by_group[g]), g)):
        yield order, spared | {p.vm for p in by_group[group]}
    for index, group in enumerate(order):
        if index:
            yield [group, *order[:index], *order[index + 1 :]], spared
    for index, group in enumerate(order[:-1]):
        yield [*order[:index], *order[index + 1 :], group], spared


def _served(plan: Plan) -> frozenset[str]:
    return frozenset(placement.demand for placement in plan.placements)

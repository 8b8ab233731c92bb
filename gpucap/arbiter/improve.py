"""Least disruption over the whole plan (rule 7 as rule 8 reads it), for small sets.

The planner serves groups one at a time (rule 8's order) and gives each its least disruptive
legal placement given what the earlier groups took. That can cost more over the whole plan than
needed: an earlier group takes the cheap reclaim a later group needed, or free capacity that
would have spared a later group a reclaim, and the later group then preempts more, or from a
more important pool. Rule 8 says the order of service decides who is served, not how badly:
rule 7 is judged over the whole plan, against the best legal plan serving the same demands.

`whole_plan` looks for such a plan by re-planning with the groups served in other orders. Each
re-plan is the planner itself (with its own legality machinery, whatever rules it learns), so
every candidate keeps every rule the planner keeps. It is a local search: from the best plan so
far it tries, in this order, the whole order reversed (lowest-ranked groups first, as they may
reclaim from fewer pools; this alone mends most plans that touched a pool they need not have),
each group moved to the front, each moved to the back, and each pair of groups swapped; it
moves to the first candidate that is strictly less disruptive and serves exactly the same
demands, and starts again from there. A candidate serving other demands is never taken, so who
is served stays rule 8's answer.

Disruption over a plan is `plan_cost`: the planner's rule-7 key (`planner.disruption_cost`)
over all the plan's victims. Only a strictly smaller key replaces a plan, so the first plan
wins every tie and the result is deterministic. The search runs only where it is cheap: sets of
up to `MAX_READY_NODES` ready nodes whose first plan preempts, with at least two groups; a
re-plan there costs milliseconds to a few tens of them, and `MAX_REPLANS` bounds the work (on
tests/arbiter/contested.py's sets of up to 64 nodes: about 50 ms a plan on average, 1.5 s at
most). Larger sets keep the planner's first plan.

Measured against the exact optimum (tests/arbiter/test_exact_disruption.py, 320 random sets of
up to 64 nodes): without this pass plans were 12x the optimum on average (31x over the sets
with victims), and the worst 1,059x (a plan that touched a pool the optimum spares); with it,
1.0055x on average (1.015x over the sets with victims) and 1.33x at worst.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

from gpucap.arbiter.model import Plan, Snapshot

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

# Sets with more ready nodes keep the planner's plan (large sets must plan fast).
MAX_READY_NODES = 64
# At most this many re-plans per plan.
MAX_REPLANS = 64


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
    replan: Callable[[list[str]], Plan],
) -> Plan:
    """The least disruptive plan found that serves the same demands as ``first`` (made with
    the groups in ``order``), re-planning with ``replan(order)``; ``first`` itself when none is
    better."""
    if not first.preemptions or len(order) < 2 or ready_nodes > MAX_READY_NODES:
        return first
    rank = {pool.name: pool.rank for pool in snapshot.pools}
    started = {vm.id: (vm.started_at - _EPOCH) // _MICROSECOND for vm in snapshot.vms}
    served = _served(first)
    best = (plan_cost(first, rank, started), first, order)
    tried = {tuple(order)}
    replans = 0
    improved = True
    while improved and replans < MAX_REPLANS:
        improved = False
        for candidate in _neighbours(best[2]):
            if tuple(candidate) in tried:
                continue
            if replans == MAX_REPLANS:
                break
            tried.add(tuple(candidate))
            replans += 1
            result = replan(candidate)
            if _served(result) != served:
                continue
            cost = plan_cost(result, rank, started)
            if cost < best[0]:
                best = (cost, result, candidate)
                improved = True
                break
    return best[1]


def _neighbours(order: list[str]) -> list[list[str]]:
    """The whole order reversed (lowest-ranked groups first: they may reclaim from fewer
    pools), then each group moved to the front, then each moved to the back, then each pair of
    groups swapped."""
    fronts = [[group, *order[:index], *order[index + 1 :]] for index, group in enumerate(order)]
    backs = [[*order[:index], *order[index + 1 :], group] for index, group in enumerate(order)]
    swaps = []
    for first, second in itertools.combinations(range(len(order)), 2):
        swapped = list(order)
        swapped[first], swapped[second] = swapped[second], swapped[first]
        swaps.append(swapped)
    return [order[::-1], *fronts[1:], *backs[:-1], *swaps]


def _served(plan: Plan) -> frozenset[str]:
    return frozenset(placement.demand for placement in plan.placements)

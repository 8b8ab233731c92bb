"""A `PlanMemo` carried from one plan to the next (as the simulation carries it from step to
step) never changes a plan: over random sets and random next steps that share most of their
nodes and VMs, each plan made with the memo is the plan made without one."""

import dataclasses

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpucap.arbiter import plan, snapshot_problems
from gpucap.arbiter.model import Snapshot
from gpucap.arbiter.planner import PlanMemo
from tests.arbiter.fleets import snapshots

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def next_step(draw, snapshot: Snapshot) -> Snapshot:
    """The set a step later: some VMs gone or under notice, pools' ranks swapped (a schedule),
    other demands, a node cordoned; every other node and VM the very same object."""
    vms = []
    for vm in snapshot.vms:
        fate = draw(st.sampled_from(("same", "same", "same", "gone", "notified")))
        if fate == "notified":
            vms.append(dataclasses.replace(vm, state="notified"))
        elif fate == "same":
            vms.append(vm)
    pools = list(snapshot.pools)
    if len(pools) > 1 and draw(st.booleans()):
        first, second = draw(st.permutations(range(len(pools))))[:2]
        a, b = pools[first], pools[second]
        pools[first] = dataclasses.replace(a, rank=b.rank)
        pools[second] = dataclasses.replace(b, rank=a.rank)
    nodes = snapshot.nodes
    if draw(st.booleans()):
        index = draw(st.integers(0, len(nodes) - 1))
        cordoned = dataclasses.replace(nodes[index], state="cordoned")
        nodes = (*nodes[:index], cordoned, *nodes[index + 1 :])
    demands = tuple(d for d in snapshot.demands if draw(st.booleans()))
    return dataclasses.replace(
        snapshot, nodes=nodes, pools=tuple(pools), vms=tuple(vms), demands=demands
    )


@st.composite
def two_steps(draw, **options) -> tuple[Snapshot, Snapshot]:
    first = draw(snapshots(**options))
    return first, next_step(draw, first)


def plans_with_one_memo(steps: list[Snapshot]) -> list:
    memo = PlanMemo()
    return [plan(snapshot, memo=memo) for snapshot in steps]


@PROPERTY
@given(two_steps(max_jobs=2, crowded=True))
def test_a_memo_carried_between_steps_changes_no_plan(steps):
    first, second = steps
    assume(snapshot_problems(second) == [])
    sequence = [first, second, first, second]
    assert plans_with_one_memo(sequence) == [plan(snapshot) for snapshot in sequence]


@PROPERTY
@given(two_steps(max_jobs=2, tenancy=True))
def test_a_memo_changes_no_plan_with_quotas_and_dedicated_nodes(steps):
    first, second = steps
    assume(snapshot_problems(second) == [])
    sequence = [first, second, first]
    assert plans_with_one_memo(sequence) == [plan(snapshot) for snapshot in sequence]


@settings(max_examples=50, deadline=None)
@given(snapshots(max_jobs=2, crowded=True))
def test_planning_the_same_snapshot_again_reuses_its_nodes_and_vms(snapshot):
    memo = PlanMemo()
    first = plan(snapshot, memo=memo)
    assert memo.nodes is not None and memo.nodes[0] is snapshot.nodes
    kept = {key: built for key, (_, _, built) in memo.vms.items()}

    assert plan(snapshot, memo=memo) == first == plan(snapshot)
    assert all(memo.vms[key][2] is built for key, built in kept.items() if key in memo.vms)

"""Whole jobs (#17): VMs sharing a group are one running job, reclaimed whole or not at all.

Hand-written sets show each part of the rule (members on other nodes, disruption counting
them all, a member that may never go, a member already under notice, a member's node freed for
later demands); property tests over both fabrics check that a running job is never partly
reclaimed and that a plan reclaiming a job counts all its GPUs."""

import json

import pytest
from hypothesis import HealthCheck, given, settings

from gpucap.arbiter import SnapshotError, load_snapshot, plan
from gpucap.arbiter.codec import snapshot_from_dict, snapshot_to_dict
from gpucap.arbiter.explain import render_plan
from gpucap.arbiter.model import Node
from gpucap.arbiter.planner import _Planner, _Reclaims
from tests.arbiter.fleets import demand, snapshot, snapshots, vm
from tests.arbiter.rules import rule_violations

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JOB = "acme/train-7"


def job_vms(*, nodes=("n001", "n002"), pool="spot", minute=0, group=JOB, **extra):
    """Four 4-GPU VMs of one job, two per node."""
    return [
        vm(f"job-{n}", pool, node, gpus, minute, group=group, **extra)
        for n, (node, gpus) in enumerate(
            [(node, block) for node in nodes for block in ((0, 1, 2, 3), (4, 5, 6, 7))], start=1
        )
    ]


def two_nodes(**kwargs):
    return snapshot(nodes=[Node("n001", 8), Node("n002", 8)], **kwargs)


def test_reclaiming_one_member_reclaims_the_whole_job_on_every_node():
    fleet = two_nodes(vms=job_vms(tenant="acme"), demands=[demand("od-1", "rent", 8)])
    result = plan(fleet)

    assert rule_violations(fleet, result) == []
    assert sorted(p.vm for p in result.preemptions) == ["job-1", "job-2", "job-3", "job-4"]
    assert {p.node for p in result.preemptions} == {"n001", "n002"}
    assert {p.for_demand for p in result.preemptions} == {"od-1"}
    (placement,) = result.placements
    assert placement.preempts == ("job-1", "job-2", "job-3", "job-4")
    for preemption in result.preemptions:
        assert "reclaimed with its job: reclaims job acme/train-7: 4 VMs, 16 GPUs, together" in (
            preemption.reason
        )
    spot = next(b for b in result.pools if b.name == "spot")
    assert (spot.before_gpus, spot.after_gpus) == (16, 0), "all 16 of the job's GPUs go"
    assert "reclaims job acme/train-7: 4 VMs, 16 GPUs, together" in render_plan(fleet, result)


def test_a_job_counts_all_its_gpus_as_disruption():
    # n003's lone 8-GPU VM started earlier (more progress lost), but the job costs 16 GPUs.
    fleet = snapshot(
        nodes=[Node("n001", 8), Node("n002", 8), Node("n003", 8)],
        vms=[*job_vms(minute=200), vm("lone", "spot", "n003", tuple(range(8)), 0)],
        demands=[demand("od-1", "rent", 8)],
    )
    result = plan(fleet)
    assert [p.vm for p in result.preemptions] == ["lone"]


def test_the_gpus_a_job_frees_elsewhere_serve_later_demands_without_more_victims():
    fleet = two_nodes(
        vms=job_vms(),
        demands=[demand("od-1", "rent", 8, minute=1), demand("od-2", "rent", 8, minute=2)],
    )
    result = plan(fleet)
    assert rule_violations(fleet, result) == []
    assert sorted(p.node for p in result.placements) == ["n001", "n002"]
    assert len(result.preemptions) == 4 and result.complete
    second = next(p for p in result.placements if p.demand == "od-2")
    assert second.preempts == ()


def test_a_job_with_a_member_that_may_never_go_keeps_every_member():
    vms = job_vms()
    vms[3] = vm("job-4", "rent", "n002", (4, 5, 6, 7), group=JOB)  # on-demand member
    fleet = two_nodes(vms=vms, demands=[demand("od-1", "rent", 8)])
    result = plan(fleet)
    assert result.preemptions == () and not result.complete
    # The reason names the job that is kept, not the on-demand VMs alone.
    (waiting,) = result.unsatisfied
    assert waiting.reason.endswith(
        "of 2 candidates on ready nodes, 1 holds on-demand VMs, 1 is held by jobs that cannot be "
        "reclaimed whole"
    ), waiting.reason


def test_a_demand_only_pinned_job_members_could_serve_says_so():
    vms = job_vms(nodes=("n001",))  # two spot members on n001
    vms.append(vm("job-3", "rent", "n002", (0, 1, 2, 3, 4, 5, 6, 7), group=JOB))
    fleet = snapshot(
        nodes=[Node("n001", 8), Node("n002", 8, state="cordoned")],
        vms=vms,
        demands=[demand("od-1", "rent", 8)],
    )
    (waiting,) = plan(fleet).unsatisfied
    assert waiting.reason == (
        "no node has a free or reclaimable 8-GPU partition: every candidate is held by a running "
        "job that is reclaimed whole or not at all, and another of its VMs may not be preempted"
    )


def test_a_member_under_notice_is_not_notified_again_and_the_rest_go_together():
    vms = job_vms()
    vms[0] = vm("job-1", "spot", "n001", (0, 1, 2, 3), group=JOB, state="notified")
    fleet = two_nodes(vms=vms, demands=[demand("od-1", "rent", 8)])
    result = plan(fleet)
    assert rule_violations(fleet, result) == []
    assert sorted(p.vm for p in result.preemptions) == ["job-2", "job-3", "job-4"]
    assert all("3 VMs, 12 GPUs, together" in p.reason for p in result.preemptions)


def test_a_member_on_a_cordoned_node_is_reclaimed_with_its_job():
    fleet = snapshot(
        nodes=[Node("n001", 8), Node("n002", 8, state="cordoned")],
        vms=job_vms(),
        demands=[demand("od-1", "rent", 8)],
    )
    result = plan(fleet)
    assert rule_violations(fleet, result) == []
    assert len(result.preemptions) == 4
    assert result.placements[0].node == "n001"


def test_the_job_field_is_read_written_and_checked():
    fleet = two_nodes(vms=job_vms())
    data = snapshot_to_dict(fleet)
    assert data["vms"][0]["group"] == JOB
    assert load_snapshot(json.dumps(data)) == fleet
    assert (
        "group" not in snapshot_to_dict(two_nodes(vms=[vm("solo", "spot", "n001", (0,))]))["vms"][0]
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (7, "vms[0] (job-1): group must be a string, got 7"),
        ("", "vms[0] (job-1): group must be a non-empty job name, got ''"),
    ],
)
def test_a_bad_job_name_is_one_clear_problem(value, problem):
    data = snapshot_to_dict(two_nodes(vms=job_vms()))
    data["vms"][0]["group"] = value
    with pytest.raises(SnapshotError) as refused:
        snapshot_from_dict(data)
    assert refused.value.problems == [problem]


def _never_partly_reclaimed(fleet) -> None:
    result = plan(fleet)
    assert rule_violations(fleet, result) == []
    preempted = {p.vm: p for p in result.preemptions}
    jobs: dict[str, list] = {}
    for member in fleet.vms:
        if member.group is not None and member.state == "running":
            jobs.setdefault(member.group, []).append(member)
    for job, members in jobs.items():
        gone = [m for m in members if m.id in preempted]
        assert len(gone) in (0, len(members)), f"job {job} partly reclaimed"
        if gone and len(members) > 1:
            gpus = sum(len(m.gpus) for m in members)
            words = f"reclaims job {job}: {len(members)} VMs, {gpus} GPUs, together"
            assert all(words in preempted[m.id].reason for m in members)
    # The plan counts every reclaimed job's GPUs: the balances lose all of them.
    lost = {}
    for p in result.preemptions:
        lost[p.pool] = lost.get(p.pool, 0) + len(p.gpus)
    placed = {}
    pools = {d.id: d.pool for d in fleet.demands}
    for p in result.placements:
        placed[pools[p.demand]] = placed.get(pools[p.demand], 0) + len(p.gpus)
    for balance in result.pools:
        assert balance.after_gpus == (
            balance.before_gpus - lost.get(balance.name, 0) + placed.get(balance.name, 0)
        )


@PROPERTY
@given(snapshots(fabric="nvswitch", crowded=True, max_jobs=3))
def test_nvswitch_a_running_job_is_never_partly_reclaimed(fleet):
    _never_partly_reclaimed(fleet)


@PROPERTY
@given(snapshots(fabric="pcie", crowded=True, max_jobs=3))
def test_pcie_a_running_job_is_never_partly_reclaimed(fleet):
    _never_partly_reclaimed(fleet)


def _reclaim_index_is_current(fleet) -> None:
    """After planning, every ready node's reclaim entries are what indexing it afresh gives,
    although they name job members on other nodes that the plan may have preempted."""
    planner = _Planner(fleet)
    planner._prefer_disks = lambda: None  # moves free placements after the last reclaim
    planner.run()
    for size, reclaims in sorted(planner.reclaims.items()):
        fresh = _Reclaims(planner, size)
        assert reclaims.legal_top() == fresh.legal_top(), size
        for node in planner.ready_nodes:
            before = _named(reclaims.victims[node])
            reclaims.index(node)
            assert _named(reclaims.victims[node]) == before, (size, planner.node_names[node])


def _named(victims_at: dict) -> dict:
    return {block: sorted(vm.id for vm in vms) for block, vms in victims_at.items()}


@PROPERTY
@given(snapshots(crowded=True, max_jobs=3, max_demands=8))
def test_the_reclaim_index_stays_current_when_a_members_node_changes(fleet):
    _reclaim_index_is_current(fleet)


@pytest.mark.parametrize("demands", [1, 2])
def test_the_reclaim_index_of_the_node_a_job_left_is_current(demands):
    wanted = [demand(f"od-{n}", "rent", 8, minute=n) for n in range(1, demands + 1)]
    _reclaim_index_is_current(two_nodes(vms=job_vms(), demands=wanted))

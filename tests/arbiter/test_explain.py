"""The words operators read in the dry-run preview: each preemption's rule and each waiting
demand's binding reason."""

from gpucap.arbiter import load_snapshot, plan
from gpucap.arbiter.explain import render_plan
from gpucap.arbiter.model import Deployment, Node, Pool
from tests.arbiter.fleets import at, demand, snapshot, standard_pools, vm
from tests.arbiter.test_planner import EXAMPLE


def reason_for(demand_id: str, **fleet) -> str:
    result = plan(snapshot(**fleet))
    return next(u.reason for u in result.unsatisfied if u.demand == demand_id)


def test_a_preemption_names_its_demand_the_rule_and_the_victims_rank_and_floor():
    result = plan(load_snapshot(EXAMPLE.read_text()))
    assert result.preemptions[0].reason == (
        "reclaimed for vm-9 (pool rent, rank 2): pool spot is rank 3, below rank 2, and stays "
        "at or above its floor of 0 GPUs (4 → 0)"
    )


def test_a_floor_that_binds_is_named_with_its_pool_and_size():
    reason = reason_for(
        "d1",
        nodes=[Node("n001", 8), Node("n002", 8)],
        pools=standard_pools(spot_floor=16),
        vms=[vm("a", "spot", "n001", tuple(range(8))), vm("b", "spot", "n002", tuple(range(8)))],
        demands=[demand("d1", "chat", 8)],
    )
    assert reason == (
        "no free 8-GPU partition, and reclaiming one would take pool spot below its floor of "
        "16 GPUs (it holds 16)"
    )


def test_a_min_replicas_that_binds_is_named_with_its_deployment():
    reason = reason_for(
        "d1",
        pools=[Pool("rent", "on_demand", 1, 0), Pool("serve", "inference", 2, 0)],
        deployments=[Deployment("llama", "serve", 2)],
        vms=[
            vm("r1", "serve", "n001", (0, 1, 2, 3), deployment="llama"),
            vm("r2", "serve", "n001", (4, 5, 6, 7), deployment="llama"),
        ],
        demands=[demand("d1", "rent", 4)],
    )
    assert reason == (
        "no free 4-GPU partition, and reclaiming one would take deployment llama below its "
        "minimum of 2 replicas (it runs 2)"
    )


def test_a_rank_that_binds_names_the_pool_in_the_way():
    reason = reason_for(
        "d1",
        vms=[vm("a", "chat", "n001", (0, 1, 2, 3)), vm("b", "spot", "n001", (4, 5, 6, 7))],
        demands=[demand("d1", "rent", 8)],
    )
    assert reason == (
        "no free 8-GPU partition, and every reclaimable one holds a VM of pool chat (rank 1) or "
        "of a higher-ranked pool; pool rent (rank 2) may only reclaim from pools ranked below it"
    )


def test_only_on_demand_vms_in_the_way():
    reason = reason_for(
        "d1",
        vms=[vm("a", "rent", "n001", (0, 1, 2, 3)), vm("b", "rent", "n001", (4, 5, 6, 7))],
        demands=[demand("d1", "chat", 4)],
    )
    assert reason == (
        "no node has a free or reclaimable 4-GPU partition: only on-demand VMs hold the "
        "candidate partitions, and on-demand VMs are never preempted"
    )


def test_partitions_given_earlier_in_the_plan():
    reason = reason_for("d2", demands=[demand("d1", "chat", 8), demand("d2", "rent", 8)])
    assert reason == (
        "no node has a free or reclaimable 8-GPU partition: every candidate was given to a "
        "demand served earlier in this plan"
    )


def test_failed_gpus_in_every_candidate():
    reason = reason_for(
        "d1", nodes=[Node("n001", 8, failed_gpus=(3,))], demands=[demand("d1", "chat", 8)]
    )
    assert reason == (
        "no node has a free or reclaimable 8-GPU partition: every candidate includes a failed GPU"
    )


def test_several_blockers_are_counted():
    reason = reason_for(
        "d1",
        nodes=[Node("n001", 8), Node("n002", 8, failed_gpus=(0,))],
        vms=[
            vm("a", "rent", "n001", (0,)),
            vm("b", "spot", "n001", (4,), state="notified"),
            vm("c", "rent", "n002", (4, 5, 6, 7)),
        ],
        demands=[demand("d1", "chat", 4)],
    )
    assert reason == (
        "no node has a free or reclaimable 4-GPU partition: of 4 candidates on ready nodes, "
        "2 hold on-demand VMs, 1 is reserved for VMs under notice, 1 includes a failed GPU"
    )


def test_no_ready_node_has_the_size_at_all():
    reason = reason_for(
        "d1",
        nodes=[Node("n001", 4), Node("n002", 8, state="cordoned")],
        demands=[demand("d1", "chat", 8)],
    )
    assert reason == (
        "no ready node has an 8-GPU partition (1 node that has one is cordoned, draining or down)"
    )


def test_pcie_sets_speak_of_gpus():
    reason = reason_for(
        "d1",
        fabric="pcie",
        nodes=[Node("n001", 2)],
        vms=[vm("a", "rent", "n001", (0,)), vm("b", "rent", "n001", (1,))],
        demands=[demand("d1", "chat", 1)],
    )
    assert reason.startswith("no node has a free or reclaimable GPU: only on-demand VMs")


def test_the_rest_of_a_group_is_told_which_demand_held_it_back():
    result = plan(
        snapshot(
            vms=[vm("a", "rent", "n001", (4, 5, 6, 7))],
            demands=[
                demand("vm-11", "chat", 4, group="g1"),
                demand("vm-12", "chat", 4, group="g1"),
            ],
        )
    )
    reasons = {u.demand: u.reason for u in result.unsatisfied}
    assert reasons["vm-12"].startswith("no node has a free or reclaimable 4-GPU partition")
    assert reasons["vm-11"] == (
        "group g1 could not be placed whole: demand vm-12 (4 GPUs) cannot be placed: "
        + reasons["vm-12"]
    )


def test_the_explain_table_shows_placements_preemptions_pools_and_waiting_demands():
    fleet = load_snapshot(EXAMPLE.read_text())
    text = render_plan(fleet, plan(fleet))
    assert "Plan for capacity set h100-east (nvswitch, H100-SXM5-80GB)" in text
    lines = text.splitlines()
    assert any(line.split()[:3] == ["vm-9", "n001", "0,1,2,3,4,5,6,7"] for line in lines)
    assert any(line.split()[:5] == ["vm-1", "-", "spot", "n001", "0,1,2,3"] for line in lines)
    assert any(line.split() == ["3", "spot", "spot", "0", "4", "0"] for line in lines)
    assert "Unsatisfied (0)" in text


def test_the_explain_table_shows_running_time_from_now():
    fleet = snapshot(
        vms=[vm("a", "spot", "n001", tuple(range(8)), minute=0)],
        demands=[demand("d1", "chat", 8)],
    )
    assert fleet.now == at(600)
    assert "10h 00m" in render_plan(fleet, plan(fleet))


def test_the_lowest_ranked_pool_is_told_it_may_reclaim_from_no_one():
    reason = reason_for(
        "d1",
        vms=[vm("a", "spot", "n001", tuple(range(8)))],
        demands=[demand("d1", "spot", 8)],
    )
    assert reason == (
        "no free 8-GPU partition, and pool spot (rank 3) ranks lowest in the set, so it may "
        "reclaim from no one"
    )

"""The planner on hand-made sets: one behaviour of DESIGN.md section 3 per test."""

import dataclasses
import json
from pathlib import Path

from gpucap.arbiter import dump_plan, load_snapshot, plan
from gpucap.arbiter.model import Deployment, Node, Pool
from tests.arbiter.fleets import at, demand, snapshot, standard_pools, vm

EXAMPLE = Path(__file__).with_name("design_example.json")


def test_the_design_example_reclaims_vm_1_for_vm_9_on_n001():
    result = plan(load_snapshot(EXAMPLE.read_text()))
    assert result.complete
    (placement,) = result.placements
    assert (placement.demand, placement.node, placement.gpus, placement.preempts) == (
        "vm-9",
        "n001",
        (0, 1, 2, 3, 4, 5, 6, 7),
        ("vm-1",),
    )
    (preemption,) = result.preemptions
    assert (preemption.vm, preemption.pool, preemption.node, preemption.gpus) == (
        "vm-1",
        "spot",
        "n001",
        (0, 1, 2, 3),
    )
    assert preemption.for_demand == "vm-9"
    balances = {b.name: (b.before_gpus, b.after_gpus, b.floor_gpus) for b in result.pools}
    assert balances == {"chat": (2, 2, 8), "rent": (0, 8, 0), "spot": (4, 0, 0)}


def test_free_capacity_is_used_before_anyone_is_preempted():
    result = plan(
        snapshot(
            nodes=[Node("n001", 8), Node("n002", 8)],
            vms=[vm("vm-1", "spot", "n001", (0, 1, 2, 3))],
            demands=[demand("d1", "chat", 8)],
        )
    )
    assert result.preemptions == ()
    assert result.placements[0].node == "n002"


def test_free_placement_is_best_fit_and_keeps_whole_nodes_free():
    result = plan(
        snapshot(
            nodes=[Node("n001", 8), Node("n002", 8)],
            vms=[vm("vm-1", "rent", "n002", (0, 1, 2, 3, 4, 5)), vm("vm-2", "rent", "n002", (6,))],
            demands=[demand("d1", "rent", 1), demand("d2", "rent", 8, minute=301)],
        )
    )
    placed = {p.demand: (p.node, p.gpus) for p in result.placements}
    assert placed == {"d1": ("n002", (7,)), "d2": ("n001", (0, 1, 2, 3, 4, 5, 6, 7))}
    assert result.preemptions == ()


def test_gpus_freed_beyond_the_block_serve_later_groups_without_more_preemptions():
    # d1 can only get a 4-GPU partition by reclaiming the 8-GPU vm-1; the other half it frees
    # is free capacity for d2, a later group, which preempts no one.
    result = plan(
        snapshot(
            nodes=[Node("n001", 8)],
            vms=[vm("vm-1", "spot", "n001", tuple(range(8)))],
            demands=[
                demand("d1", "chat", 4, minute=300),
                demand("d2", "rent", 4, minute=301),
            ],
        )
    )
    assert [p.vm for p in result.preemptions] == ["vm-1"]
    assert {p.demand: p.preempts for p in result.placements} == {"d1": ("vm-1",), "d2": ()}


def test_victims_come_from_the_lowest_ranked_pool_first_even_if_that_costs_more_gpus():
    pools = [*standard_pools(), Pool("scavenger", "spot", 4, 0)]
    result = plan(
        snapshot(
            nodes=[Node("n001", 8), Node("n002", 8)],
            pools=pools,
            vms=[
                vm("vm-1", "spot", "n001", (0,)),
                vm("vm-2", "rent", "n001", (4, 5, 6, 7)),
                vm("vm-3", "scavenger", "n002", (0, 1, 2, 3)),
                vm("vm-4", "rent", "n002", (4, 5, 6, 7)),
            ],
            demands=[demand("d1", "chat", 4)],
        )
    )
    # n001's {0..3} costs one spot GPU (GPUs 1-3 are free), n002's four scavenger GPUs; the
    # scavenger pool ranks lowest, so it loses first.
    assert [p.vm for p in result.preemptions] == ["vm-3"]


def _reclaim_for_a_pair(candidates: dict[str, list]) -> list[str]:
    """Plan a 2-GPU chat demand on nodes whose GPUs 0-3 hold the given spot VMs and whose
    other GPUs are on-demand, so only GPUs 0-3 can be reclaimed."""
    nodes, vms = [], []
    for name, spot_vms in candidates.items():
        nodes.append(Node(name, 8))
        vms += [*spot_vms, vm(f"od-{name}", "rent", name, (4, 5, 6, 7))]
    result = plan(snapshot(nodes=nodes, vms=vms, demands=[demand("d1", "chat", 2)]))
    return [p.vm for p in result.preemptions]


def test_then_fewest_gpus():
    assert _reclaim_for_a_pair(
        {
            "n001": [vm("four", "spot", "n001", (0, 1, 2, 3), minute=200)],
            "n002": [vm("pair", "spot", "n002", (0, 1)), vm("od", "rent", "n002", (2, 3))],
        }
    ) == ["pair"]


def test_then_fewest_vms():
    assert _reclaim_for_a_pair(
        {
            "n001": [
                vm("one", "spot", "n001", (0,), minute=200),
                vm("two", "spot", "n001", (1,), minute=200),
                vm("od-1", "rent", "n001", (2, 3)),
            ],
            "n002": [vm("pair", "spot", "n002", (0, 1)), vm("od-2", "rent", "n002", (2, 3))],
        }
    ) == ["pair"]


def test_then_the_most_recently_started():
    assert _reclaim_for_a_pair(
        {
            "n001": [vm("old", "spot", "n001", (0, 1), minute=0), vm("x", "rent", "n001", (2, 3))],
            "n002": [vm("new", "spot", "n002", (0, 1), minute=90), vm("y", "rent", "n002", (2, 3))],
        }
    ) == ["new"]


def test_equal_costs_break_ties_by_node_name_then_vm_id():
    vms = [
        vm("vm-b", "spot", "n002", (0, 1), minute=50),
        vm("vm-a", "spot", "n003", (0, 1), minute=50),
        vm("vm-c", "spot", "n001", (0, 1), minute=50),
    ]
    fillers = [
        vm(f"od-{n}-{i}", "rent", n, block)
        for n in ("n001", "n002", "n003")
        for i, block in enumerate([(2, 3), (4, 5, 6, 7)])
    ]
    nodes = [Node("n003", 8), Node("n001", 8), Node("n002", 8)]
    result = plan(snapshot(nodes=nodes, vms=vms + fillers, demands=[demand("d1", "chat", 2)]))
    assert [(p.vm, p.node) for p in result.preemptions] == [("vm-c", "n001")]


def test_floors_hold_across_the_whole_plan():
    nodes = [Node(f"n00{i}", 8) for i in (1, 2, 3)]
    vms = [vm(f"vm-{i}", "spot", f"n00{i}", tuple(range(8))) for i in (1, 2, 3)]
    result = plan(
        snapshot(
            nodes=nodes,
            pools=standard_pools(spot_floor=8),
            vms=vms,
            demands=[demand(f"d{i}", "chat", 8, minute=300 + i) for i in (1, 2, 3)],
        )
    )
    assert [p.demand for p in result.placements] == ["d1", "d2"]
    assert result.unsatisfied[0].demand == "d3"
    assert "would take pool spot below its floor of 8 GPUs" in result.unsatisfied[0].reason
    spot = next(b for b in result.pools if b.name == "spot")
    assert (spot.before_gpus, spot.after_gpus) == (24, 8)


def test_deployments_keep_their_min_replicas():
    pools = [Pool("rent", "on_demand", 1, 0), Pool("batch", "inference", 2, 0)]
    result = plan(
        snapshot(
            nodes=[Node("n001", 2)],
            pools=pools,
            deployments=[Deployment("llama", "batch", 1)],
            vms=[
                vm("r1", "batch", "n001", (0,), deployment="llama"),
                vm("r2", "batch", "n001", (1,), deployment="llama"),
            ],
            demands=[demand("d1", "rent", 1), demand("d2", "rent", 1, minute=301)],
        )
    )
    assert [p.vm for p in result.preemptions] == ["r1"]  # equal start times: by VM id
    assert "keeps 1 replica, minimum 1" in result.preemptions[0].reason
    assert "below its minimum of 1 replica" in result.unsatisfied[0].reason


def test_on_demand_vms_are_never_preempted():
    result = plan(
        snapshot(
            vms=[vm("vm-1", "rent", "n001", tuple(range(8)))],
            demands=[demand("d1", "chat", 1)],
        )
    )
    assert result.preemptions == ()
    assert "only on-demand VMs hold the candidate partitions" in result.unsatisfied[0].reason


def test_only_strictly_lower_ranks_lose():
    pools = [Pool("a", "spot", 1, 0), Pool("b", "spot", 2, 0), Pool("c", "spot", 3, 0)]
    result = plan(
        snapshot(
            pools=pools,
            vms=[vm("vm-1", "b", "n001", tuple(range(8)))],
            demands=[demand("d1", "b", 8)],
        )
    )
    assert result.preemptions == ()
    assert "may only reclaim from pools ranked below it" in result.unsatisfied[0].reason


def test_notified_vms_are_neither_victims_nor_free():
    result = plan(
        snapshot(
            nodes=[Node("n001", 8)],
            vms=[
                vm("vm-1", "spot", "n001", (0, 1, 2, 3), state="notified"),
                vm("vm-2", "spot", "n001", (4, 5, 6, 7)),
            ],
            demands=[demand("d1", "chat", 4), demand("d2", "chat", 4, minute=301)],
        )
    )
    assert [p.vm for p in result.preemptions] == ["vm-2"]
    assert [p.demand for p in result.placements] == ["d1"]
    spot = next(b for b in result.pools if b.name == "spot")
    assert spot.before_gpus == 4  # the notified VM is already leaving
    result = plan(
        snapshot(
            vms=[vm("vm-1", "spot", "n001", tuple(range(8)), state="notified")],
            demands=[demand("d1", "chat", 1)],
        )
    )
    assert result.preemptions == ()
    assert "reserved for VMs already under an interruption notice" in result.unsatisfied[0].reason


def test_a_group_is_placed_whole_or_not_at_all():
    result = plan(
        snapshot(
            nodes=[Node("n001", 8)],
            vms=[
                vm("vm-1", "spot", "n001", (0, 1, 2, 3)),
                vm("vm-2", "rent", "n001", (4, 5, 6, 7)),
            ],
            demands=[
                demand("d1", "chat", 4, group="job"),
                demand("d2", "chat", 4, group="job"),
                demand("d3", "chat", 2, minute=400),
            ],
        )
    )
    # The job cannot get two 4-GPU partitions, so vm-1 is not preempted for it; d3 then takes
    # a 2-GPU partition of vm-1 on its own.
    assert [p.demand for p in result.placements] == ["d3"]
    assert {u.demand for u in result.unsatisfied} == {"d1", "d2"}
    reasons = {u.demand: u.reason for u in result.unsatisfied}
    assert reasons["d1"].startswith("group job could not be placed whole: demand d2 (4 GPUs)")
    assert [p.for_demand for p in result.preemptions] == ["d3"]


def test_a_mixed_rank_group_lets_its_lower_ranked_demands_pick_free_capacity_first():
    pools = [Pool("chat", "inference", 1, 0), Pool("spot", "spot", 2, 0)]
    result = plan(
        snapshot(
            nodes=[Node("n001", 4)],
            pools=pools,
            vms=[vm("vm-1", "spot", "n001", (0,)), vm("vm-2", "spot", "n001", (1,))],
            demands=[
                demand("d1", "chat", 1, group="g"),
                demand("d2", "spot", 1, group="g"),
                demand("d3", "spot", 1, group="g"),
            ],
        )
    )
    assert result.complete
    assert {p.demand: p.preempts for p in result.placements}["d1"] in {("vm-1",), ("vm-2",)}


def test_a_group_that_fits_on_free_capacity_preempts_no_one_even_where_best_fit_misses_it():
    # Best fit gives the 4-GPU demand n001's free half (it breaks no free 8), and then the
    # 2-GPU demand finds no free pair: n002's table has none. Rule 6 still holds: the 4-GPU
    # demand fits on n002, the pair on n001, and nobody is preempted.
    halves = ((0, 1, 2, 3, 4, 5, 6, 7), (0, 1, 2, 3), (4, 5, 6, 7))
    result = plan(
        snapshot(
            nodes=[Node("n001", 8), Node("n002", 8, partitions=halves)],
            vms=[vm("vm-1", "spot", "n001", (4, 5, 6, 7))],
            demands=[demand("d1", "chat", 4, group="job"), demand("d2", "chat", 2, group="job")],
        )
    )
    assert result.complete and result.preemptions == ()
    assert {p.demand: p.node for p in result.placements} == {"d1": "n002", "d2": "n001"}


def test_a_group_prefers_one_victim_whose_freed_gpus_serve_two_of_its_demands():
    # Each 4-GPU demand alone would reclaim a 4-GPU VM on n002 (4 GPUs beat 8). For the pair,
    # vm-big's 8 GPUs serve both: as many GPUs as vm-a and vm-b together, but one VM.
    result = plan(
        snapshot(
            nodes=[Node("n001", 8), Node("n002", 8)],
            vms=[
                vm("vm-big", "spot", "n001", tuple(range(8))),
                vm("vm-a", "spot", "n002", (0, 1, 2, 3), minute=100),
                vm("vm-b", "spot", "n002", (4, 5, 6, 7), minute=100),
            ],
            demands=[demand("d1", "chat", 4, group="job"), demand("d2", "chat", 4, group="job")],
        )
    )
    assert [p.vm for p in result.preemptions] == ["vm-big"]
    assert [(p.node, p.preempts) for p in result.placements] == [
        ("n001", ("vm-big",)),
        ("n001", ()),
    ]


def test_a_group_member_may_use_gpus_another_member_reclaims_from_a_pool_it_may_not_touch():
    # batch (rank 3) may not preempt train (rank 2); chat (rank 1) may. The group is placed in
    # the order that works: d1 reclaims vm-1, and d2 takes the half that vm-1 leaves free.
    pools = [
        Pool("chat", "inference", 1, 0),
        Pool("train", "spot", 2, 0),
        Pool("batch", "spot", 3, 0),
    ]
    result = plan(
        snapshot(
            pools=pools,
            vms=[vm("vm-1", "train", "n001", tuple(range(8)))],
            demands=[
                demand("d1", "chat", 4, group="g", minute=301),
                demand("d2", "batch", 4, group="g", minute=300),
            ],
        )
    )
    assert result.complete
    assert [(p.demand, p.preempts) for p in result.placements] == [
        ("d1", ("vm-1",)),
        ("d2", ()),
    ]
    assert [p.for_demand for p in result.preemptions] == ["d1"]


def test_groups_are_served_by_rank_then_request_time_then_id():
    pools = [*standard_pools(), Pool("batch", "spot", 4, 0)]
    demands = [
        demand("late-chat", "chat", 8, minute=500),
        demand("early-rent", "rent", 8, minute=100),
        demand("b", "chat", 8, minute=200, group="same-time-b"),
        demand("a", "chat", 8, minute=200, group="same-time-a"),
    ]
    result = plan(snapshot(nodes=[Node("n001", 8), Node("n002", 8)], pools=pools, demands=demands))
    assert [p.demand for p in result.placements] == ["a", "b"]
    assert [u.demand for u in result.unsatisfied] == ["late-chat", "early-rent"]


def test_the_tenant_of_a_victim_is_passed_through_to_the_preview():
    result = plan(
        snapshot(
            vms=[vm("vm-1", "spot", "n001", tuple(range(8)), tenant="acme")],
            demands=[demand("d1", "chat", 8)],
        )
    )
    assert result.preemptions[0].tenant == "acme"


def test_the_plan_does_not_depend_on_now():
    base = load_snapshot(EXAMPLE.read_text())
    later = dataclasses.replace(base, now=at(100_000))
    assert dump_plan(plan(base)) == dump_plan(plan(later))
    assert json.loads(dump_plan(plan(base)))["complete"] is True

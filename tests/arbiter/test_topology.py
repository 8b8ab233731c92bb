"""Topology (DESIGN.md section 2): which blocks a VM can be given on a node."""

import pytest

from gpucap.arbiter import plan
from gpucap.arbiter.model import Node
from gpucap.arbiter.topology import (
    default_partitions,
    gpu_count_problem,
    partition_table,
    placeable_partitions,
)
from tests.arbiter.fleets import HGX_PAIRS, demand, snapshot, vm


def test_the_default_table_of_an_8_gpu_baseboard_is_the_one_of_the_design():
    assert default_partitions(8) == (
        (0, 1, 2, 3, 4, 5, 6, 7),
        (0, 1, 2, 3),
        (4, 5, 6, 7),
        (0, 1),
        (2, 3),
        (4, 5),
        (6, 7),
        (0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,),
    )  # fmt: skip


def test_smaller_nodes_get_the_same_power_of_two_table_cut_to_size():
    assert default_partitions(4) == ((0, 1, 2, 3), (0, 1), (2, 3), (0,), (1,), (2,), (3,))
    assert default_partitions(2) == ((0, 1), (0,), (1,))
    assert default_partitions(1) == ((0,),)
    # 6 GPUs: no 8, one 4, three pairs.
    assert [b for b in default_partitions(6) if len(b) > 1] == [
        (0, 1, 2, 3),
        (0, 1),
        (2, 3),
        (4, 5),
    ]


def test_a_node_table_replaces_the_default_entirely():
    node = Node("n001", 8, partitions=HGX_PAIRS)
    assert partition_table(node, "nvswitch") == HGX_PAIRS
    pairs = [b for b in partition_table(node, "nvswitch") if len(b) == 2]
    assert pairs == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert (0, 1) not in partition_table(node, "nvswitch")


def test_pcie_nodes_give_single_cards_only():
    node = Node("n001", 4)
    assert partition_table(node, "pcie") == ((0,), (1,), (2,), (3,))
    assert placeable_partitions(node, "pcie", 2) == []


def test_failed_gpus_and_unready_nodes_take_nothing():
    node = Node("n001", 8, failed_gpus=(2,))
    assert placeable_partitions(node, "nvswitch", 8) == []
    assert placeable_partitions(node, "nvswitch", 4) == [(4, 5, 6, 7)]
    assert (2,) not in placeable_partitions(node, "nvswitch", 1)
    assert placeable_partitions(Node("n002", 8, state="cordoned"), "nvswitch", 1) == []


@pytest.mark.parametrize(
    ("fabric", "gpus", "allowed"),
    [
        ("nvswitch", 1, True),
        ("nvswitch", 2, True),
        ("nvswitch", 3, False),
        ("nvswitch", 4, True),
        ("nvswitch", 6, False),
        ("nvswitch", 8, True),
        ("pcie", 1, True),
        ("pcie", 2, False),
    ],
)
def test_gpu_counts_follow_the_fabric(fabric, gpus, allowed):
    assert (gpu_count_problem(fabric, gpus) is None) == allowed


def test_a_pair_on_an_hgx_node_is_placed_on_a_table_pair_never_on_adjacent_indices():
    # GPUs 0 and 2 are taken, so by adjacency {0,1} and {2,3} would both look half free; the
    # table's pairs are {0,2} (taken), {1,3}, {4,6}, {5,7}.
    nodes = [Node("n001", 8, partitions=HGX_PAIRS)]
    result = plan(
        snapshot(
            nodes=nodes,
            vms=[vm("vm-1", "rent", "n001", (0, 2))],
            demands=[demand("d1", "rent", 2)],
        )
    )
    (placement,) = result.placements
    assert placement.gpus in {(1, 3), (4, 6), (5, 7)}
    assert placement.gpus == (1, 3)  # best fit: keeps the free 4-GPU partition {4..7} whole


def test_a_partition_with_a_failed_gpu_is_never_given_even_by_reclaim():
    nodes = [Node("n001", 8, failed_gpus=(7,))]
    result = plan(
        snapshot(
            nodes=nodes,
            vms=[vm("vm-1", "spot", "n001", (0, 1, 2, 3)), vm("vm-2", "spot", "n001", (4, 5))],
            demands=[demand("d1", "rent", 8), demand("d2", "rent", 4)],
        )
    )
    assert [u.demand for u in result.unsatisfied] == ["d1"]
    assert "failed GPU" in result.unsatisfied[0].reason
    (placement,) = result.placements
    assert placement.gpus == (0, 1, 2, 3)

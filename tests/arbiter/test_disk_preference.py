"""A demand that names the node holding its disk (``disk_node``: a reclaimed spot VM waiting to
resume) is placed there when that node has a free partition that fits as well as the best one
elsewhere. The preference sits below every rule of DESIGN.md section 3: it never changes who is
served, who is preempted, or how well the free capacity is packed."""

import dataclasses
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucap.arbiter import SnapshotError, load_snapshot, plan, snapshot_problems
from gpucap.arbiter.codec import snapshot_to_dict
from gpucap.arbiter.model import Node
from tests.arbiter.fleets import demand, snapshot, snapshots, vm
from tests.arbiter.rules import rule_violations


def resuming(demand_id: str, pool: str, gpus: int, disk_node: str, **kwargs):
    return dataclasses.replace(demand(demand_id, pool, gpus, **kwargs), disk_node=disk_node)


def placed(result) -> dict:
    return {p.demand: (p.node, p.gpus) for p in result.placements}


def test_a_resuming_vm_goes_back_to_the_node_that_holds_its_disk():
    nodes = [Node("n001", 8), Node("n002", 8), Node("n003", 8)]
    fresh = plan(snapshot(nodes=nodes, demands=[demand("vm-7", "spot", 2)]))
    assert placed(fresh) == {"vm-7": ("n001", (0, 1))}
    back = plan(snapshot(nodes=nodes, demands=[resuming("vm-7", "spot", 2, "n003")]))
    assert placed(back) == {"vm-7": ("n003", (0, 1))}
    assert back.preemptions == ()


def test_the_disk_node_loses_to_a_better_fit_elsewhere():
    # n002 has one free GPU left: taking it breaks no free larger partition, while any GPU of
    # the empty n001 would break its free 8-, 4- and 2-GPU partitions. Packing comes first.
    nodes = [Node("n001", 8), Node("n002", 8)]
    vms = [vm("vm-1", "rent", "n002", (0, 1, 2, 3, 4, 5)), vm("vm-2", "rent", "n002", (6,))]
    result = plan(snapshot(nodes=nodes, vms=vms, demands=[resuming("vm-7", "spot", 1, "n001")]))
    assert placed(result) == {"vm-7": ("n002", (7,))}


def test_a_disk_node_that_is_not_ready_is_no_preference():
    nodes = [Node("n001", 8), Node("n002", 8, state="cordoned")]
    result = plan(snapshot(nodes=nodes, demands=[resuming("vm-7", "spot", 1, "n002")]))
    assert placed(result) == {"vm-7": ("n001", (0,))}


def test_a_disk_node_with_no_free_partition_is_no_reason_to_preempt():
    # n002 holds the disk but is full of spot VMs; an on-demand resume takes free n001 rather
    # than reclaiming on n002 (free capacity first, rule 6).
    nodes = [Node("n001", 8), Node("n002", 8)]
    vms = [vm("vm-1", "spot", "n002", tuple(range(8)))]
    result = plan(snapshot(nodes=nodes, vms=vms, demands=[resuming("vm-7", "rent", 8, "n002")]))
    assert placed(result) == {"vm-7": ("n001", tuple(range(8)))}
    assert result.preemptions == ()


def test_reclaims_ignore_the_disk_node_rule_7_decides_down_to_the_node_name():
    nodes = [Node("n001", 8), Node("n002", 8)]
    vms = [
        vm("vm-1", "spot", "n001", tuple(range(8)), minute=10),
        vm("vm-2", "spot", "n002", tuple(range(8)), minute=10),
    ]
    result = plan(snapshot(nodes=nodes, vms=vms, demands=[resuming("vm-7", "rent", 8, "n002")]))
    assert [p.vm for p in result.preemptions] == ["vm-1"]
    assert placed(result) == {"vm-7": ("n001", tuple(range(8)))}


def test_disk_node_travels_through_the_snapshot_file_and_is_checked():
    original = snapshot(nodes=[Node("n001", 8)], demands=[resuming("vm-7", "spot", 1, "n001")])
    data = snapshot_to_dict(original)
    assert data["demands"][0]["disk_node"] == "n001"
    assert load_snapshot(json.dumps(data)).demands == original.demands
    # A demand without a disk writes no key: section 7 files stay as they were.
    assert (
        "disk_node"
        not in snapshot_to_dict(snapshot(demands=[demand("d", "spot", 1)]))["demands"][0]
    )
    data["demands"][0]["disk_node"] = "n404"
    try:
        load_snapshot(json.dumps(data))
    except SnapshotError as exc:
        assert exc.problems == ["demands[0] (vm-7): disk_node n404 is not a node of the snapshot"]
    else:
        raise AssertionError("an unknown disk node must be refused")


# --- below every rule ---------------------------------------------------------------------------


@st.composite
def with_disk_nodes(draw, fabric: str):
    """A random set, and the same set where some demands name a random node as their disk's."""
    base = draw(snapshots(fabric=fabric))
    names = [node.name for node in base.nodes]
    demands = tuple(
        dataclasses.replace(d, disk_node=draw(st.sampled_from([None, *names])))
        for d in base.demands
    )
    return base, dataclasses.replace(base, demands=demands)


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.sampled_from(["nvswitch", "pcie"]).flatmap(with_disk_nodes))
def test_the_preference_changes_no_outcome_only_where_a_vm_lands(pair):
    base, preferring = pair
    assert snapshot_problems(preferring) == []
    without, with_disks = plan(base), plan(preferring)
    assert rule_violations(preferring, with_disks) == []
    # Who is served, who is preempted and what stays unsatisfied are the same.
    assert {p.demand for p in with_disks.placements} == {p.demand for p in without.placements}
    assert sorted(p.vm for p in with_disks.preemptions) == sorted(p.vm for p in without.preemptions)
    assert [u.demand for u in with_disks.unsatisfied] == [u.demand for u in without.unsatisfied]
    assert with_disks.pools == without.pools
    assert with_disks.preemptions == without.preemptions
    # A placement moves only to its demand's disk node, and only if it preempts nobody.
    disk_of = {d.id: d.disk_node for d in preferring.demands}
    before = {p.demand: p for p in without.placements}
    for placement in with_disks.placements:
        old = before[placement.demand]
        assert len(placement.gpus) == len(old.gpus)
        assert placement.preempts == old.preempts
        if placement != old:
            assert placement.preempts == ()
            assert placement.node == disk_of[placement.demand]

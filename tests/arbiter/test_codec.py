"""Snapshot and plan files: reading, writing, and the checks the Django side reuses."""

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpucap.arbiter import SnapshotError, dump_plan, load_snapshot, plan, snapshot_problems
from gpucap.arbiter.codec import snapshot_from_dict, snapshot_to_dict
from gpucap.arbiter.model import Node, Vm
from tests.arbiter.fleets import at, snapshot, snapshots, vm
from tests.arbiter.test_planner import EXAMPLE


@settings(max_examples=150, deadline=None)
@given(snapshots(max_jobs=2))
def test_a_snapshot_survives_a_round_trip_through_json(fleet):
    text = json.dumps(snapshot_to_dict(fleet))
    assert load_snapshot(text) == fleet


@settings(max_examples=100, deadline=None)
@given(snapshots(max_jobs=2, tenancy=True))
def test_tenants_dedicated_nodes_and_quotas_survive_a_round_trip(fleet):
    text = json.dumps(snapshot_to_dict(fleet))
    assert load_snapshot(text) == fleet


@settings(max_examples=100, deadline=None)
@given(snapshots(max_jobs=2, tenancy=True, reservations=True))
def test_reservations_and_borrowers_survive_a_round_trip(fleet):
    text = json.dumps(snapshot_to_dict(fleet))
    assert load_snapshot(text) == fleet


def test_the_design_example_reads_with_its_defaults():
    fleet = load_snapshot(EXAMPLE.read_text())
    assert fleet.nodes[0].partitions is None
    assert fleet.nodes[0].failed_gpus == ()
    assert fleet.vms[0].state == "running"
    assert fleet.vms[0].tenant is None
    assert fleet.vms[1].deployment == "llama-70b"
    assert fleet.now is None


def test_the_optional_extensions_are_read():
    data = json.loads(EXAMPLE.read_text())
    data["now"] = "2026-11-29T12:00:00+00:00"
    data["vms"][0]["state"] = "notified"
    data["vms"][0]["tenant"] = "acme"
    fleet = snapshot_from_dict(data)
    assert fleet.now == at(240)
    assert (fleet.vms[0].state, fleet.vms[0].tenant) == ("notified", "acme")


def test_snapshot_problems_checks_a_snapshot_built_in_code():
    fleet = snapshot(
        nodes=[Node("n001", 8)],
        vms=[
            vm("vm-1", "spot", "n001", (0, 1)),
            Vm("vm-2", "spot", "n001", (1, 2), at(0)),
            vm("vm-3", "ghost", "n009", (0,)),
        ],
    )
    assert snapshot_problems(fleet) == [
        "vms[1] (vm-2): gpus [1, 2] are not a partition of node n001's table",
        "vms[1] (vm-2): gpu 1 of node n001 is already held by VM vm-1",
        "vms[2] (vm-3): pool ghost is not a pool of the snapshot",
        "vms[2] (vm-3): node n009 is not a node of the snapshot",
    ]
    assert snapshot_problems(dataclasses.replace(fleet, vms=fleet.vms[:1])) == []


def test_load_snapshot_raises_with_every_problem():
    try:
        load_snapshot('{"set": 1, "nodes": {}, "pools": [], "vms": [3], "demands": []}')
    except SnapshotError as error:
        assert error.problems == [
            "set: must be an object, got 1",
            "nodes: must be a list, got {}",
            "vms[0]: must be an object, got 3",
        ]
    else:
        raise AssertionError("no SnapshotError")


def test_a_plan_is_written_one_line_per_item_with_the_keys_of_the_design():
    text = dump_plan(plan(load_snapshot(EXAMPLE.read_text())))
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    assert '    {"demand": "vm-9", "node": "n001", "gpus": [0, 1, 2, 3, 4, 5, 6, 7], ' in text
    assert '  "unsatisfied": [],' in lines
    assert json.loads(text)["pools"][0] == {
        "name": "chat",
        "before_gpus": 2,
        "after_gpus": 2,
        "floor_gpus": 8,
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 12) | st.text(max_size=4) | st.floats(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


EXAMPLE_PATHS = [path for path in _paths(json.loads(EXAMPLE.read_text())) if path]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(EXAMPLE_PATHS), json_values), min_size=1, max_size=3))
def test_any_mangled_snapshot_is_either_planned_or_refused_with_problems(changes):
    data = json.loads(EXAMPLE.read_text())
    for path, value in changes:
        target = data
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    try:
        fleet = snapshot_from_dict(data)
    except SnapshotError as error:
        assert error.problems
        assert all(isinstance(problem, str) and "\n" not in problem for problem in error.problems)
    else:
        assert snapshot_problems(fleet) == []
        plan(fleet)


def test_a_name_with_a_line_break_still_makes_one_line_per_problem():
    data = json.loads(EXAMPLE.read_text())
    data["vms"][0]["pool"] = "sp\not"
    try:
        snapshot_from_dict(data)
    except SnapshotError as error:
        assert error.problems == ["vms[0] (vm-1): pool sp\\not is not a pool of the snapshot"]
    else:
        raise AssertionError("no SnapshotError")


def test_a_bad_item_among_good_ones_is_named_and_a_json_true_is_no_gpu_index():
    # Well-formed sections are read in one pass; one bad item sends its section item by item.
    data = json.loads(EXAMPLE.read_text())
    data["nodes"][0]["failed_gpus"] = [False]
    data["nodes"][-1]["partitions"] = [[0, 1], [True]]
    data["vms"][-1]["gpus"] = [True]
    data["demands"][0]["gpus"] = True
    try:
        snapshot_from_dict(data)
    except SnapshotError as error:
        assert error.problems == [
            "nodes[0] (n001): failed_gpus must be a list of GPU indices, got [false]",
            "nodes[1] (n002): partitions[1] must be a list of GPU indices, got [true]",
            "vms[1] (vm-2): gpus must be a list of GPU indices, got [true]",
            "demands[0] (vm-9): gpus must be an integer, got true",
        ]
    else:
        raise AssertionError("no SnapshotError")

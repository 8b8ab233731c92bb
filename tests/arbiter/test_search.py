"""The exact group search (search.py) as the planner uses it: within its budget, on large sets
through a region, and as deterministic as the rest of the planner. Its exactness on small sets
is checked against exhaustive search in test_least_disruption."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings

from gpucap.arbiter import planner
from gpucap.arbiter.codec import snapshot_to_dict
from gpucap.arbiter.model import Node, Plan, Snapshot
from tests.arbiter.fleets import demand, reclaim_scenario, snapshot, snapshots, vm
from tests.arbiter.rules import rule_violations
from tests.arbiter.test_least_disruption import one_group, planner_choice

ROOT = Path(__file__).resolve().parents[2]
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def heuristic_plan(snapshot: Snapshot) -> Plan:
    """The plan the planner makes without its search: its first, order-by-order placement."""
    with mock.patch.object(planner._Planner, "_search", return_value=None):
        return planner.plan(snapshot)


def no_worse(snapshot: Snapshot, searched: Plan, heuristic: Plan) -> bool:
    """For a single group: placed whenever the heuristic placed it, and as least disruptive."""
    found, first = planner_choice(snapshot, searched), planner_choice(snapshot, heuristic)
    if first is None:
        return True
    return found is not None and (found == () or (first != () and found <= first))


def a_job_of_twelve_gpus_on_a_full_pcie_set() -> Snapshot:
    nodes = [Node(f"n{index:03d}", 8) for index in range(1, 7)]
    vms = [
        vm(f"vm-{node.name}-{card}", "spot", node.name, (card,), minute=(card * 37) % 240)
        for node in nodes
        for card in range(8)
    ]
    demands = [demand(f"d{index:02d}", "chat", 1, group="job") for index in range(12)]
    return snapshot(fabric="pcie", nodes=nodes, vms=vms, demands=demands)


def test_a_search_that_runs_out_of_budget_keeps_a_valid_placement():
    job = a_job_of_twelve_gpus_on_a_full_pcie_set()
    with mock.patch.object(planner, "_SEARCH_BUDGET", 20):
        run = planner._Planner(job)
        result = run.run()
    assert [cut_short for _, cut_short in run.searches] == [True]
    assert result.complete and len(result.preemptions) == 12
    assert rule_violations(job, result) == []
    assert no_worse(job, result, heuristic_plan(job))


@PROPERTY
@given(snapshots(min_demands=2, max_demands=6, crowded=True, max_jobs=2))
def test_a_search_cut_short_is_never_worse_than_the_heuristic(random_set):
    group = one_group(random_set)
    with mock.patch.object(planner, "_SEARCH_BUDGET", 8):
        result = planner.plan(group)
    assert rule_violations(group, result) == []
    assert no_worse(group, result, heuristic_plan(group))


@PROPERTY
@given(snapshots(min_demands=2, max_demands=6, max_jobs=2))
def test_a_region_search_obeys_every_rule_and_never_loses_to_the_heuristic(random_set):
    # Every set counts as large here, so the search looks at a region, as on a real fleet.
    group = one_group(random_set)
    with mock.patch.object(planner, "_WHOLE_SET_NODES", 0):
        result = planner.plan(group)
    assert rule_violations(group, result) == []
    assert no_worse(group, result, heuristic_plan(group))


def test_searched_plans_are_the_same_bytes_in_processes_with_different_hash_seeds(tmp_path):
    busy = reclaim_scenario(random.Random(16), max_nodes=20, max_demands=16)
    run = planner._Planner(busy)
    run.run()
    assert len(run.searches) >= 2
    path = tmp_path / "set.json"
    path.write_text(json.dumps(snapshot_to_dict(busy)))
    outputs = set()
    for seed in ("1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-m", "gpucap.arbiter", "plan", str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed},
            check=True,
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1

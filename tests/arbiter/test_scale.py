"""Planning stays near linear on the fleets that used to hurt: floors that bind on every
reclaim, groups that fail over and over, and large groups that the group search could spend
long on. (The throughput figures are in bench/.)"""

import gc
import random
import time

from bench.arbiter_scale import generate
from gpucap.arbiter import plan
from gpucap.arbiter.codec import snapshot_from_dict
from tests.arbiter.rules import rule_violations


def floor_bound_fleet(nodes: int) -> dict:
    """Every GPU busy; spot may lose exactly one more GPU, the other pools none; demands come
    in pairs of 1-GPU chat VMs, so each pair's first reclaim uses up spot's headroom and its
    second finds every reclaim stopped by a floor."""
    data = generate(nodes, random.Random(7))
    held: dict[str, int] = {}
    used: dict[str, set[int]] = {}
    for vm in data["vms"]:
        held[vm["pool"]] = held.get(vm["pool"], 0) + len(vm["gpus"])
        used.setdefault(vm["node"], set()).update(vm["gpus"])
    for pool in data["pools"]:
        pool["floor_gpus"] = held[pool["name"]] - (1 if pool["name"] == "spot" else 0)
    for node in data["nodes"]:
        for index in range(8):
            if index not in used.get(node["name"], set()) and index not in node["failed_gpus"]:
                data["vms"].append(
                    {
                        "id": f"fill-{node['name']}-{index}",
                        "pool": "rent",
                        "node": node["name"],
                        "gpus": [index],
                        "started_at": "2026-11-29T01:00:00Z",
                    }
                )
    data["demands"] = [
        {
            "id": f"pair-{group}-{member}",
            "group": f"pair-{group}",
            "pool": "chat",
            "gpus": 1,
            "requested_at": "2026-11-29T11:00:00Z",
        }
        for group in range(nodes // 5)
        for member in range(2)
    ]
    return data


def seconds_to_plan(data: dict) -> float:
    snapshot = snapshot_from_dict(data)
    gc.collect()
    started = time.perf_counter()
    result = plan(snapshot)
    elapsed = time.perf_counter() - started
    assert rule_violations(snapshot, result) == []
    return elapsed


def test_floors_that_bind_everywhere_do_not_make_planning_quadratic():
    small = seconds_to_plan(floor_bound_fleet(400))
    large = seconds_to_plan(floor_bound_fleet(1600))
    # Four times the nodes and demands: linear is x4. Quadratic (as once) was x16 and more.
    assert large < 8 * small + 0.05, (small, large)


def fleet_of_large_groups(nodes: int) -> dict:
    """The bench's set with its demands gathered into groups of eight (mixed sizes and pools):
    the group search's worst case, which its budget keeps bounded."""
    data = generate(nodes, random.Random(7))
    for position, demand in enumerate(data["demands"]):
        demand["group"] = f"job-{position // 8:04d}"
    return data


def test_large_groups_do_not_make_planning_explode():
    small = seconds_to_plan(fleet_of_large_groups(400))
    large = seconds_to_plan(fleet_of_large_groups(1600))
    assert large < 8 * small + 0.05, (small, large)

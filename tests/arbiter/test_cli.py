"""``python -m gpucap.arbiter``: the offline CLI, run as operators run it (a subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.arbiter.test_planner import EXAMPLE

ROOT = Path(__file__).resolve().parents[2]


def arbiter(*args: str, stdin: str | None = None, hash_seed: str = "0"):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": hash_seed}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "-m", "gpucap.arbiter", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )


def example() -> dict:
    return json.loads(EXAMPLE.read_text())


def test_plan_prints_the_design_example_plan_as_json():
    done = arbiter("plan", str(EXAMPLE))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert list(result) == ["complete", "placements", "preemptions", "unsatisfied", "pools"]
    assert result["complete"] is True
    assert result["placements"] == [
        {"demand": "vm-9", "node": "n001", "gpus": [0, 1, 2, 3, 4, 5, 6, 7], "preempts": ["vm-1"]}
    ]
    (preemption,) = result["preemptions"]
    assert list(preemption) == ["vm", "pool", "node", "gpus", "for", "reason"]
    assert preemption["vm"] == "vm-1" and preemption["for"] == "vm-9"
    assert result["pools"][2] == {
        "name": "spot",
        "before_gpus": 4,
        "after_gpus": 0,
        "floor_gpus": 0,
    }


def test_a_dash_reads_the_snapshot_from_stdin():
    done = arbiter("plan", "-", stdin=EXAMPLE.read_text())
    assert done.returncode == 0, done.stderr
    assert done.stdout == arbiter("plan", str(EXAMPLE)).stdout


def test_explain_prints_the_same_plan_as_tables():
    done = arbiter("explain", str(EXAMPLE))
    assert done.returncode == 0, done.stderr
    for heading in ("Placements (1)", "Preemptions (1)", "Pools", "Unsatisfied (0)"):
        assert heading in done.stdout
    assert "reclaimed for vm-9 (pool rent, rank 2)" in done.stdout


def test_the_same_snapshot_gives_the_same_bytes_in_processes_with_different_hash_seeds(tmp_path):
    import random

    from bench.arbiter_scale import generate

    path = tmp_path / "set.json"
    path.write_text(json.dumps(generate(150, random.Random(7))))
    outputs = {arbiter("plan", str(path), hash_seed=seed).stdout for seed in ("1", "2", "3")}
    assert len(outputs) == 1
    assert json.loads(outputs.pop())["preemptions"]


def test_a_missing_file_exits_2_without_a_traceback():
    done = arbiter("plan", "/nonexistent/snapshot.json")
    assert done.returncode == 2
    assert done.stderr.startswith("/nonexistent/snapshot.json: cannot read")
    assert "Traceback" not in done.stderr


def test_malformed_json_exits_2_with_one_line():
    done = arbiter("plan", "-", stdin='{"set": {')
    assert done.returncode == 2
    assert done.stderr.startswith("snapshot: not valid JSON:")
    assert len(done.stderr.splitlines()) == 1
    assert "Traceback" not in done.stderr


def broken(mutate) -> list[str]:
    data = example()
    mutate(data)
    done = arbiter("plan", "-", stdin=json.dumps(data))
    assert done.returncode == 2, done.stdout
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    return done.stderr.splitlines()


def _set(path, value):
    def mutate(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            _set(("vms", 0, "pool"), "batch"),
            ["vms[0] (vm-1): pool batch is not a pool of the snapshot"],
        ),
        (
            _set(("demands", 0, "pool"), "batch"),
            ["demands[0] (vm-9): pool batch is not a pool of the snapshot"],
        ),
        (
            _set(("vms", 1, "node"), "n003"),
            ["vms[1] (vm-2): node n003 is not a node of the snapshot"],
        ),
        (
            _set(("vms", 1, "deployment"), "mistral"),
            ["vms[1] (vm-2): deployment mistral is not a deployment of the snapshot"],
        ),
        (
            _set(("deployments", 0, "pool"), "rent"),
            [
                "deployments[0] (llama-70b): pool rent is a on_demand pool; deployments belong "
                "to inference pools",
                "vms[1] (vm-2): deployment llama-70b belongs to pool rent, not chat",
            ],
        ),
        (
            _set(("vms", 1, "gpus"), [8]),
            ["vms[1] (vm-2): gpus [8] out of range for node n002 with 8 GPUs"],
        ),
        (
            _set(("vms", 1, "gpus"), [0, 1]),
            ["vms[1] (vm-2): gpus [0, 1] are not a partition of node n002's table"],
        ),
        (
            _set(("vms", 1, "node"), "n001"),
            [
                "vms[1] (vm-2): gpus [0, 2] are not a partition of node n001's table",
                "vms[1] (vm-2): gpu 0 of node n001 is already held by VM vm-1",
                "vms[1] (vm-2): gpu 2 of node n001 is already held by VM vm-1",
            ],
        ),
        (
            _set(("demands", 0, "gpus"), 3),
            [
                "demands[0] (vm-9): gpus: 3 GPUs is not an NVLink partition size: NVSwitch sets "
                "allocate whole partitions of 1, 2, 4 or 8 GPUs"
            ],
        ),
        (
            _set(("pools", 2, "rank"), 2),
            [
                "pools[2] (spot): rank 2 is also the rank of pool rent; ranks are unique within "
                "a set"
            ],
        ),
        (
            _set(("pools", 2, "name"), "rent"),
            [
                "pools[2] (rent): name rent is used by another pool",
                "vms[0] (vm-1): pool spot is not a pool of the snapshot",
            ],
        ),
        (
            _set(("vms", 1, "id"), "vm-1"),
            ["vms[1] (vm-1): id vm-1 is used by another VM"],
        ),
        (
            _set(("nodes", 1, "name"), "n001"),
            [
                "nodes[1] (n001): name n001 is used by another node",
                "vms[1] (vm-2): node n002 is not a node of the snapshot",
            ],
        ),
        (
            _set(("nodes", 0, "gpus"), "8"),
            ['nodes[0] (n001): gpus must be an integer, got "8"'],
        ),
        (
            _set(("pools", 0, "floor_gpus"), -1),
            ["pools[0] (chat): floor_gpus must be 0 or more, got -1"],
        ),
        (
            _set(("vms", 0, "started_at"), "yesterday"),
            [
                "vms[0] (vm-1): started_at must be an ISO 8601 time with a time zone (e.g. "
                '"2026-11-29T10:00:00Z"), got "yesterday"'
            ],
        ),
        (
            _set(("nodes", 1, "partitions"), [[0, 1, 2], [9]]),
            [
                "nodes[1] (n002): partitions[0] [0, 1, 2] has 3 GPUs; partitions have 1, 2, 4 or 8",
                "nodes[1] (n002): partitions[1] [9] out of range for a node with 8 GPUs",
                "vms[1] (vm-2): gpus [0, 2] are not a partition of node n002's table",
            ],
        ),
        (
            _set(("set", "fabric"), "infiniband"),
            ['set: fabric must be one of pcie, nvswitch, got "infiniband"'],
        ),
        (
            _set(("nodes", 0, "state"), "sleeping"),
            [
                "nodes[0] (n001): state must be one of ready, cordoned, draining, down, got "
                "'sleeping'"
            ],
        ),
        (
            _set(("vms", 0, "state"), "stopping"),
            ["vms[0] (vm-1): state must be one of running, notified, got 'stopping'"],
        ),
        (
            _set(("quotas",), [{"tenant": "acme", "pool": "spot", "max_gpus": -1}]),
            ["quotas[0] (acme): max_gpus must be 0 or more, got -1"],
        ),
        (
            _set(("nodes", 0, "tenant"), ["acme"]),
            ['nodes[0] (n001): tenant must be a string, got ["acme"]'],
        ),
    ],
)
def test_each_bad_input_exits_2_with_one_line_naming_the_item_and_field(mutate, expected):
    assert broken(mutate) == expected


def test_missing_and_unknown_fields_are_each_reported():
    def mutate(data):
        del data["vms"][0]["started_at"]
        data["pools"][1]["floor"] = 0
        del data["demands"]

    assert broken(mutate) == [
        'pools[1] (rent): unknown field "floor"',
        'vms[0] (vm-1): missing field "started_at"',
        'snapshot: missing field "demands"',
    ]


def test_every_problem_is_reported_not_just_the_first():
    def mutate(data):
        data["vms"][0]["gpus"] = [8]
        data["vms"][1]["pool"] = "nope"
        data["demands"][0]["gpus"] = 3

    assert broken(mutate) == [
        "vms[0] (vm-1): gpus [8] out of range for node n001 with 8 GPUs",
        "vms[1] (vm-2): pool nope is not a pool of the snapshot",
        "vms[1] (vm-2): deployment llama-70b belongs to pool chat, not nope",
        "demands[0] (vm-9): gpus: 3 GPUs is not an NVLink partition size: NVSwitch sets "
        "allocate whole partitions of 1, 2, 4 or 8 GPUs",
    ]


def test_pcie_refuses_multi_gpu_vms_demands_and_partition_tables():
    def mutate(data):
        data["set"]["fabric"] = "pcie"
        data["vms"] = [data["vms"][0]]

    assert broken(mutate) == [
        "nodes[1] (n002): partitions apply only to NVSwitch sets; a PCIe set allocates single "
        "cards",
        "vms[0] (vm-1): gpus [0, 1, 2, 3]: a VM in a PCIe set holds exactly 1 GPU, not 4",
        "demands[0] (vm-9): gpus: 8 GPUs cannot be given in a PCIe set: PCIe sets allocate "
        "single cards, so every VM has exactly 1 GPU",
    ]


def test_plan_reads_a_file_with_a_reservation_and_a_borrower(tmp_path):
    data = example()
    data["reservations"] = [{"id": "r1", "tenant": "acme", "gpus": 8, "block_gpus": 8}]
    data["vms"][0].update(tenant="globex", borrowed="r1")
    data["demands"][0]["tenant"] = "acme"
    path = tmp_path / "reserved.json"
    path.write_text(json.dumps(data))
    done = arbiter("plan", str(path))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert list(result) == [
        "complete",
        "placements",
        "preemptions",
        "unsatisfied",
        "pools",
        "reservations",
    ]
    assert result["placements"] == [
        {
            "demand": "vm-9",
            "node": "n001",
            "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
            "preempts": ["vm-1"],
            "reservation": "r1",
        }
    ]
    assert "borrowed capacity kept for that reservation" in result["preemptions"][0]["reason"]
    assert result["reservations"] == [
        {
            "id": "r1",
            "tenant": "acme",
            "gpus": 8,
            "block_gpus": 8,
            "held_before": 0,
            "held_after": 8,
            "kept_gpus": 0,
            "borrowed": [],
            "claim_reclaims": [],
            "claim_complete": True,
        }
    ]


def test_a_reservation_too_big_for_the_set_exits_2():
    def mutate(data):
        data["reservations"] = [{"id": "r1", "tenant": "acme", "gpus": 24, "block_gpus": 8}]

    assert broken(mutate) == [
        "reservations[0] (r1): gpus 24 takes the set's reservations to 24 GPUs, more than the "
        "16 GPUs of its ready nodes not dedicated to a tenant"
    ]

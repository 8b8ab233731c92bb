"""How fast does the arbiter plan a large NVSwitch capacity set? (``make bench``)

Generates sets of 500, 2,000 and 8,000 nodes x 8 GPUs with a realistic mix: several VMs of
mixed sizes on most nodes, four pools (inference, on-demand, two spot tiers) with floors, some
nodes cordoned, draining or down, some with failed GPUs, some with HGX-style non-adjacent 2-GPU
partitions, and about 0.4 demands per node in groups (single VMs, inference scale-ups and
multi-VM jobs) from pools of every rank, so that a good share needs reclaims. Each snapshot is
written to a file and planned by the CLI as a separate process, three times; the figures are
whole-process wall times (Python start-up and JSON parsing included).

Targets (issue 3): at 2,000 nodes at least 1,000 demands planned per second, and time growing no
faster than 1.25 x linearly from 500 to 8,000 nodes.
"""

from __future__ import annotations

import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = (500, 2000, 8000)
RUNS = 3
SEED = 20261129
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

HGX_PAIRS = [
    [0, 1, 2, 3, 4, 5, 6, 7],
    [0, 1, 2, 3],
    [4, 5, 6, 7],
    [0, 2],
    [1, 3],
    [4, 6],
    [5, 7],
    *([index] for index in range(8)),
]
DEFAULT_TABLE = [
    [0, 1, 2, 3, 4, 5, 6, 7],
    [0, 1, 2, 3],
    [4, 5, 6, 7],
    [0, 1],
    [2, 3],
    [4, 5],
    [6, 7],
    *([index] for index in range(8)),
]
# (name, kind, rank, share of running GPUs, share of demands)
POOLS = (
    ("chat", "inference", 1, 0.20, 0.25),
    ("rent", "on_demand", 2, 0.30, 0.35),
    ("train", "spot", 3, 0.20, 0.20),
    ("spot", "spot", 4, 0.30, 0.20),
)
VM_SIZES = ((8, 0.10), (4, 0.25), (2, 0.30), (1, 0.35))
DEMAND_SIZES = ((8, 0.15), (4, 0.25), (2, 0.30), (1, 0.30))


def main() -> int:
    print("arbiter scale: NVSwitch sets, 8 GPUs per node, planner CLI as a subprocess")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, median of {RUNS} runs\n")
    header = (
        f"{'nodes':>6} {'GPUs':>7} {'demands':>8} {'groups':>7} {'satisfied':>10} "
        f"{'preempted':>10} {'median s':>9} {'demands/s':>10} {'growth/linear':>14} "
        f"{'in-process s':>13}"
    )
    print(header)
    print("-" * len(header))
    results = []
    with tempfile.TemporaryDirectory(prefix="arbiter-bench-") as folder:
        for nodes in SIZES:
            snapshot = generate(nodes, random.Random(SEED + nodes))
            path = Path(folder) / f"set-{nodes}.json"
            path.write_text(json.dumps(snapshot))
            times, plan = run_planner(path)
            median = statistics.median(times)
            inside = plan_in_process(path)
            demands = len(snapshot["demands"])
            groups = {d["group"] for d in snapshot["demands"]}
            unsatisfied_groups = {u["group"] for u in plan["unsatisfied"]}
            satisfied = 1 - len(unsatisfied_groups) / len(groups)
            growth = "-"
            if results:
                prev_nodes, prev_median = results[-1]
                growth = f"{(median / prev_median) / (nodes / prev_nodes):.2f}"
            results.append((nodes, median))
            print(
                f"{nodes:>6} {nodes * 8:>7} {demands:>8} {len(groups):>7} {satisfied:>9.0%} "
                f"{len(plan['preemptions']):>10} {median:>9.3f} {demands / median:>10.0f} "
                f"{growth:>14} {inside:>13.3f}"
            )
    (first_nodes, first_time), (last_nodes, last_time) = results[0], results[-1]
    overall = (last_time / first_time) / (last_nodes / first_nodes)
    print(
        f"\n{first_nodes} -> {last_nodes} nodes: time x{last_time / first_time:.1f} for "
        f"x{last_nodes // first_nodes} nodes, growth {overall:.2f} x linear (target <= 1.25)"
    )
    print(
        "(in-process: reading, checking and planning the file inside this process, without "
        "Python start-up)"
    )
    at_2000 = dict(results).get(2000)
    if at_2000:
        demands_2000 = round(0.4 * 2000)
        print(f"2000 nodes: about {demands_2000 / at_2000:.0f} demands/s (target >= 1000)")
    return 0


def run_planner(path: Path) -> tuple[list[float], dict]:
    times = []
    output = ""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(RUNS):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "gpucap.arbiter", "plan", str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            check=False,
        )
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            sys.exit(f"planner failed on {path.name}:\n{done.stderr}")
        output = done.stdout
    return times, json.loads(output)


def plan_in_process(path: Path) -> float:
    """Seconds to read, check and plan the snapshot file in this process (best of 3)."""
    sys.path.insert(0, str(ROOT))
    from gpucap.arbiter import dump_plan, load_snapshot, plan

    best = float("inf")
    for _ in range(RUNS):
        gc.collect()
        gc.disable()  # as the CLI does
        started = time.perf_counter()
        dump_plan(plan(load_snapshot(path.read_bytes())))
        best = min(best, time.perf_counter() - started)
        gc.enable()
    return best


def generate(node_count: int, rng: random.Random) -> dict:
    """A deterministic, realistically busy NVSwitch set of ``node_count`` 8-GPU nodes."""
    nodes, vms = [], []
    deployments = [
        {"name": f"model-{index:03d}", "pool": "chat", "min_replicas": rng.choice((1, 1, 2))}
        for index in range(max(1, node_count // 40))
    ]
    pool_names = [pool[0] for pool in POOLS]
    vm_weights = [pool[3] for pool in POOLS]
    for index in range(node_count):
        name = f"n{index + 1:05d}"
        custom = rng.random() < 0.2
        table = HGX_PAIRS if custom else DEFAULT_TABLE
        roll = rng.random()
        state = (
            "cordoned"
            if roll < 0.03
            else "draining"
            if roll < 0.04
            else "down"
            if roll < 0.05
            else "ready"
        )
        failed = [rng.randrange(8)] if rng.random() < 0.02 else []
        node = {"name": name, "gpus": 8, "state": state, "failed_gpus": failed}
        if custom:
            node["partitions"] = HGX_PAIRS
        nodes.append(node)
        used = set()
        target = rng.choice((4, 6, 7, 8, 8, 8))
        for _ in range(12):
            if len(used) >= target:
                break
            size = _pick(rng, VM_SIZES)
            free = [block for block in table if len(block) == size and not used & set(block)]
            if not free:
                continue
            block = rng.choice(free)
            used |= set(block)
            pool = rng.choices(pool_names, vm_weights)[0]
            vm = {
                "id": f"vm-{len(vms) + 1}",
                "pool": pool,
                "node": name,
                "gpus": block,
                "started_at": _time(NOW - timedelta(seconds=rng.randrange(60, 3 * 86400))),
                "tenant": f"tenant-{rng.randrange(50):02d}",
            }
            if pool == "chat":
                vm["deployment"] = rng.choice(deployments)["name"]
            vms.append(vm)
    held = dict.fromkeys(pool_names, 0)
    for vm in vms:
        held[vm["pool"]] += len(vm["gpus"])
    floors = {"chat": 0.6, "rent": 0.0, "train": 0.5, "spot": 0.0}
    pools = [
        {"name": name, "kind": kind, "rank": rank, "floor_gpus": int(held[name] * floors[name])}
        for name, kind, rank, _, _ in POOLS
    ]
    demands = []
    demand_weights = [pool[4] for pool in POOLS]
    target = round(0.4 * node_count)
    group_number = 0
    while len(demands) < target:
        group_number += 1
        pool = rng.choices(pool_names, demand_weights)[0]
        members = 1 if rng.random() < 0.6 else rng.choice((2, 2, 3, 4))
        members = min(members, target - len(demands))
        size = _pick(rng, DEMAND_SIZES)
        requested = NOW - timedelta(seconds=rng.randrange(1, 3600))
        group = f"g{group_number:05d}"
        for member in range(members):
            demand_id = f"d{group_number:05d}-{member}" if members > 1 else f"vm-new-{group_number}"
            if members == 1:
                group = demand_id
            demands.append(
                {
                    "id": demand_id,
                    "group": group,
                    "pool": pool,
                    "gpus": size if member == 0 or pool == "chat" else _pick(rng, DEMAND_SIZES),
                    "requested_at": _time(requested),
                }
            )
    return {
        "set": {"name": f"bench-{node_count}", "fabric": "nvswitch", "gpu_model": "H100-SXM5-80GB"},
        "now": _time(NOW),
        "nodes": nodes,
        "pools": pools,
        "deployments": deployments,
        "vms": vms,
        "demands": demands,
    }


def _pick(rng: random.Random, weighted: tuple[tuple[int, float], ...]) -> int:
    return rng.choices([value for value, _ in weighted], [weight for _, weight in weighted])[0]


def _time(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


if __name__ == "__main__":
    sys.exit(main())

"""How fast does the simulation replay a day on a large set? (``make bench``)

Issue 21's goal: a day at one-minute steps (1,440 steps) on a 2,000-node NVSwitch set finishes
in under a minute on this machine. The set is `arbiter_scale.generate`'s (8-GPU nodes, four
pools with floors, about 7,000 VMs, 50 inference deployments), without its demands: the run
makes its own. The load: each deployment's requests per second follow a day (quiet at night,
a ramp from 07:00, a peak around 14:00, some deployments doubling at 09:00); the spot, training
and on-demand pools get VMs asked for all day; a schedule raises the inference pool's floor and
two deployments' minimum replicas from 08:00 to 20:00. Prints wall time, steps per second,
plans made, notices and resumes, and the goal as PASS/FAIL.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import sys
import time as clock
from datetime import time
from pathlib import Path

import arbiter_scale

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpucap.arbiter import load_snapshot  # noqa: E402
from gpucap.schedules.calendar import (  # noqa: E402
    FLOOR_GPUS,
    MIN_REPLICAS,
    Change,
    Entry,
    Window,
)
from gpucap.simulation import (  # noqa: E402
    Curve,
    DeploymentLoad,
    DeploymentSpec,
    Profile,
    VmArrivals,
    simulate,
)

NODES = 2000
STEP_SECONDS = 60
DAY = 86400
GOAL_SECONDS = 60.0
SEED = 20261202


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--hours", type=float, default=24)
    args = parser.parse_args()
    start, specs, profile, entries = bench_input(args.nodes)
    print("simulate: a day of load replayed on a generated NVSwitch set, 8 GPUs per node")
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}; {len(start.nodes)} nodes, {len(start.vms)} VMs, "
        f"{len(specs)} deployments, steps of {STEP_SECONDS} s\n"
    )
    gc.collect()
    started = clock.perf_counter()
    result = simulate(
        start,
        profile,
        deployments=specs,
        entries=entries,
        notice_seconds=300,
        step_seconds=STEP_SECONDS,
        duration_seconds=int(args.hours * 3600),
        wait_threshold_seconds=2.0,
        startup_seconds=180,
    )
    wall = clock.perf_counter() - started
    steps = len(result.steps)
    kinds: dict[str, int] = {}
    for event in result.events:
        kinds[event.kind] = kinds.get(event.kind, 0) + 1
    header = ("steps", 6), ("plans", 6), ("notices", 8), ("resumes", 8), ("ended", 6)
    header += ("wall s", 7), ("steps/s", 8)
    print(" ".join(f"{name:>{width}}" for name, width in header))
    print(
        f"{steps:>6} {result.plans_made:>6} {kinds.get('notice', 0):>8} "
        f"{kinds.get('resume', 0):>8} {kinds.get('end', 0):>6} {wall:>7.1f} {steps / wall:>8.1f}"
    )
    print()
    for figure in result.figures()[:12]:
        print(f"  {figure.label}: {figure.shown()}")
    for moment in result.worst[:3]:
        print(f"  worst: {moment.words}")
    print()
    if steps * STEP_SECONDS < DAY or len(start.nodes) != NODES:
        print(f"not a day on {NODES} nodes (--nodes/--hours): no verdict")
        return 0
    passed = wall < GOAL_SECONDS
    print(
        f"{'PASS' if passed else 'FAIL'} a day at one-minute steps on {NODES} nodes: "
        f"{wall:.1f} s, {steps / wall:.0f} steps/s (target < {GOAL_SECONDS:.0f} s)"
    )
    return 0 if passed else 1


def bench_input(nodes: int):
    """The set, deployments, load and schedule of the bench (deterministic)."""
    rng = random.Random(SEED)
    data = arbiter_scale.generate(nodes, random.Random(arbiter_scale.SEED + nodes))
    data["demands"] = []
    start = load_snapshot(json.dumps(data))
    specs = {
        deployment.name: DeploymentSpec(
            pool=deployment.pool,
            gpus_per_replica=2,
            min_replicas=deployment.min_replicas,
            max_replicas=64,
            target_in_flight=4,
            replica_concurrency=8,
            queue_limit=64,
            scale_down_cooldown_seconds=600,
            tenant="tenant-chat",
        )
        for deployment in start.deployments
    }
    hour = start.now.hour
    replicas = dict.fromkeys(specs, 0)
    for vm in start.vms:
        if vm.deployment in replicas:
            replicas[vm.deployment] += 1
    loads = {}
    for index, slug in enumerate(specs):
        # At the day's peak about the replicas it runs now (8 requests/s keep one busy at the
        # autoscaler's target), give or take a fifth.
        base = replicas[slug] * 8 / 1.75 * rng.uniform(0.8, 1.2)
        doubles = index % 5 == 0
        points = []
        for minute in range(0, DAY // 60 + 1, 30):
            local = (hour + minute / 60) % 24
            day = max(0.0, math.sin((local - 7) / 14 * math.pi)) if 7 <= local <= 21 else 0.0
            rate = base * (0.25 + 1.5 * day) * (2 if doubles and 9 <= local < 17 else 1)
            points.append((minute * 60.0, round(rate, 2)))
        loads[slug] = DeploymentLoad(Curve(tuple(points)), service_seconds=0.5)
    # Per 2,000 nodes: spot 120 two-GPU VMs an hour for 2 h, training 24 eight-GPU VMs an hour
    # for 4 h, rentals 40 one-GPU VMs an hour for 3 h: about 1,400 GPUs asked for at any time,
    # on a set already about 85 % full, so that spot VMs queue and get reclaimed all day.
    scale = nodes / NODES
    pools = {
        "spot": VmArrivals(Curve(((0.0, 120 * scale),)), gpus_per_vm=2, duration_seconds=7200),
        "train": VmArrivals(Curve(((0.0, 24 * scale),)), gpus_per_vm=8, duration_seconds=14400),
        "rent": VmArrivals(Curve(((0.0, 40 * scale),)), gpus_per_vm=1, duration_seconds=10800),
    }
    chat_floor = next(pool.floor_gpus for pool in start.pools if pool.name == "chat")
    slugs = list(specs)
    day_shift = Entry(
        "day-shift",
        Window(frozenset(range(7)), time(8, 0), time(20, 0), "UTC"),
        (
            Change(FLOOR_GPUS, "chat", chat_floor + 64),
            Change(MIN_REPLICAS, slugs[0], 6),
            Change(MIN_REPLICAS, slugs[1], 6),
        ),
    )
    return start, specs, Profile(deployments=loads, pools=pools), [day_shift]


if __name__ == "__main__":
    sys.exit(main())

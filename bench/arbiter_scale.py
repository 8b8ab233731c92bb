"""How fast does the arbiter plan a large NVSwitch capacity set? (``make bench``)

Generates sets of 500, 2,000 and 8,000 nodes x 8 GPUs with a realistic mix: several VMs of
mixed sizes on most nodes, four pools (inference, on-demand, two spot tiers) with floors, some
nodes cordoned, draining or down, some with failed GPUs, some with HGX-style non-adjacent 2-GPU
partitions, and about 0.4 demands per node in groups (single VMs, inference scale-ups and
multi-VM jobs) from pools of every rank, so that a good share needs reclaims. Each snapshot is
written to a file and planned by the CLI (``python -m gpucap.arbiter plan FILE``) as a separate
process, RUNS times; the figures are whole-process wall times (Python start-up and JSON parsing
included), medians.

The floor, measured in the same run and interleaved with the CLI's runs so that both see the
same machine load: the same interpreter starting and reading the same snapshot file, that is
``python -c "import json, sys; json.loads(open(sys.argv[1], 'rb').read())" FILE`` as a
separate process (reading a JSON snapshot means parsing it, so ``json.loads`` is included;
building the snapshot's objects, checking and planning it are the CLI's own work). Both run as
the Docker image runs them: with ``PYTHONDONTWRITEBYTECODE`` set (it is in the image) and the
package's bytecode compiled beforehand (the image runs ``compileall``; the bench compiles
``gpucap/arbiter`` the same way before measuring), so neither pays for compiling source.

Targets: issue 3, at 2,000 nodes at least 1,000 demands planned per second, and time growing no
faster than 1.25 x linearly from 500 to 8,000 nodes; issue 17 (build 6), at 2,000 nodes at least
3,000 demands per second through the whole CLI, and the CLI within 4 x the floor.
``--sizes`` measures other node counts (e.g. ``--sizes 2000`` while iterating).
``--tenancy`` plans the same sets with tenant allocation (issue 19, `with_tenancy`): a tenth
of the nodes dedicated to five tenants, every demand group of one of 50 tenants, and quotas for
20 of them; ``--tenancy --reservations`` adds reservations (`with_reservations`), planned in
passes (a few plans of the set each); the default run measures the common case without any.
"""

from __future__ import annotations

import argparse
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
RUNS = 7
GOAL_NODES = 2000
GOAL_DEMANDS_PER_SECOND = 3000
GOAL_FLOOR_RATIO = 4.0
GOAL_GROWTH = 1.25
FLOOR_SCRIPT = "import json, sys; json.loads(open(sys.argv[1], 'rb').read())"
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="node counts")
    parser.add_argument(
        "--tenancy", action="store_true", help="with dedicated nodes, demand tenants and quotas"
    )
    parser.add_argument(
        "--reservations",
        action="store_true",
        help="with --tenancy, also reservations for five tenants and VMs borrowing from them",
    )
    args = parser.parse_args()
    sizes = sorted(int(size) for size in args.sizes.split(","))
    compile_bytecode()
    print(
        "arbiter scale: NVSwitch sets, 8 GPUs per node, planner CLI as a subprocess"
        + (", with dedicated nodes and quotas" if args.tenancy else "")
    )
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}, median of {RUNS} runs (CLI and floor interleaved)\n"
    )
    header = (
        f"{'nodes':>6} {'GPUs':>7} {'demands':>8} {'groups':>7} {'satisfied':>10} "
        f"{'preempted':>10} {'CLI s':>7} {'floor s':>8} {'CLI/floor':>10} {'demands/s':>10} "
        f"{'growth/linear':>14} {'in-process s':>13}"
    )
    print(header)
    print("-" * len(header))
    results = []
    with tempfile.TemporaryDirectory(prefix="arbiter-bench-") as folder:
        for nodes in sizes:
            snapshot = generate(nodes, random.Random(SEED + nodes))
            if args.tenancy:
                with_tenancy(snapshot, random.Random(SEED - nodes))
                if args.reservations:
                    with_reservations(snapshot, random.Random(SEED - 2 * nodes))
            path = Path(folder) / f"set-{nodes}.json"
            path.write_text(json.dumps(snapshot))
            times, floors, plan = run_planner(path)
            median, floor = statistics.median(times), statistics.median(floors)
            inside = plan_in_process(path)
            demands = len(snapshot["demands"])
            groups = {d["group"] for d in snapshot["demands"]}
            unsatisfied_groups = {u["group"] for u in plan["unsatisfied"]}
            satisfied = 1 - len(unsatisfied_groups) / len(groups)
            growth = "-"
            if results:
                prev = results[-1]
                growth = f"{(median / prev['median']) / (nodes / prev['nodes']):.2f}"
            results.append(
                {
                    "nodes": nodes,
                    "median": median,
                    "floor": floor,
                    "demands_per_second": demands / median,
                }
            )
            print(
                f"{nodes:>6} {nodes * 8:>7} {demands:>8} {len(groups):>7} {satisfied:>9.0%} "
                f"{len(plan['preemptions']):>10} {median:>7.3f} {floor:>8.3f} "
                f"{median / floor:>10.2f} {demands / median:>10.0f} {growth:>14} {inside:>13.3f}"
            )
    print(
        "\n(CLI s: whole process, median; floor s: the same interpreter starting and reading "
        "(json.loads) the same file, median; in-process: reading, checking and planning the "
        "file inside this process, best of the runs)"
    )
    return verdict(results)


def verdict(results: list[dict]) -> int:
    """PASS/FAIL for each target; 0 when every one measured passes."""
    lines = []
    first, last = results[0], results[-1]
    if last["nodes"] > first["nodes"]:
        growth = (last["median"] / first["median"]) / (last["nodes"] / first["nodes"])
        lines.append(
            (
                growth <= GOAL_GROWTH,
                f"{first['nodes']} -> {last['nodes']} nodes: time "
                f"x{last['median'] / first['median']:.1f} for x{last['nodes'] / first['nodes']:g} "
                f"nodes, growth {growth:.2f} x linear (target <= {GOAL_GROWTH})",
            )
        )
    at_goal = [row for row in results if row["nodes"] == GOAL_NODES]
    if at_goal:
        row = at_goal[0]
        lines.append(
            (
                row["demands_per_second"] >= GOAL_DEMANDS_PER_SECOND,
                f"{GOAL_NODES} nodes: {row['demands_per_second']:.0f} demands/s through the whole "
                f"CLI, {row['median']:.3f} s median (target >= {GOAL_DEMANDS_PER_SECOND})",
            )
        )
        ratio = row["median"] / row["floor"]
        lines.append(
            (
                ratio <= GOAL_FLOOR_RATIO,
                f"{GOAL_NODES} nodes: CLI {row['median']:.3f} s = {ratio:.2f} x the floor "
                f"{row['floor']:.3f} s (target <= {GOAL_FLOOR_RATIO:g} x)",
            )
        )
    else:
        print(f"{GOAL_NODES} nodes: not measured (--sizes), no verdict on its targets")
    print()
    for passed, text in lines:
        print(f"{'PASS' if passed else 'FAIL'} {text}")
    return 0 if all(passed for passed, _ in lines) else 1


def compile_bytecode() -> None:
    """Compile the CLI's modules as the Docker image does (``compileall``), so that no run pays
    for compiling source when PYTHONDONTWRITEBYTECODE keeps Python from caching it."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-l", "gpucap", "gpucap/arbiter"],
        cwd=ROOT,
        check=True,
    )


def run_planner(path: Path) -> tuple[list[float], list[float], dict]:
    """The CLI's and the floor's whole-process times, RUNS of each, interleaved."""
    times, floors = [], []
    output = ""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    floor_command = [sys.executable, "-c", FLOOR_SCRIPT, str(path)]
    cli_command = [sys.executable, "-m", "gpucap.arbiter", "plan", str(path)]
    for _ in range(RUNS):
        started = time.perf_counter()
        subprocess.run(floor_command, cwd=ROOT, env=env, check=True)
        floors.append(time.perf_counter() - started)
        started = time.perf_counter()
        done = subprocess.run(
            cli_command, capture_output=True, text=True, cwd=ROOT, env=env, check=False
        )
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            sys.exit(f"planner failed on {path.name}:\n{done.stderr}")
        output = done.stdout
    return times, floors, json.loads(output)


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


def with_tenancy(snapshot: dict, rng: random.Random) -> None:
    """Tenant allocation on a generated set: a tenth of the nodes dedicated to tenant-00 ..
    tenant-04, every demand group asked by one of tenant-00 .. tenant-49, and quotas in pool
    spot and for the whole set for tenant-00 .. tenant-19 (some of them binding)."""
    for node in snapshot["nodes"]:
        if rng.random() < 0.1:
            node["tenant"] = f"tenant-{rng.randrange(5):02d}"
    group_tenant: dict[str, str] = {}
    for demand in snapshot["demands"]:
        tenant = group_tenant.setdefault(demand["group"], f"tenant-{rng.randrange(50):02d}")
        demand["tenant"] = tenant
    snapshot["quotas"] = [
        {"tenant": f"tenant-{index:02d}", "pool": pool, "max_gpus": rng.randrange(0, 400, 8)}
        for index in range(20)
        for pool in ("spot", None)
    ]


def with_reservations(snapshot: dict, rng: random.Random) -> None:
    """Reservations (issue 19) on a set with tenancy: tenant-20 .. tenant-24 (without quotas)
    are promised about 4 % of the set each, in blocks of 8, and a twentieth of the other
    tenants' spot VMs borrow from one of them."""
    shared = sum(
        node["gpus"]
        for node in snapshot["nodes"]
        if node["state"] == "ready" and node.get("tenant") is None
    )
    size = max(8, shared // 25 // 8 * 8)
    owners = [f"tenant-{index:02d}" for index in range(20, 25)]
    snapshot["reservations"] = [
        {"id": f"res-{tenant}", "tenant": tenant, "gpus": size, "block_gpus": 8}
        for tenant in owners
    ]
    for vm in snapshot["vms"]:
        if vm["pool"] == "spot" and vm["tenant"] not in owners and rng.random() < 0.05:
            vm["borrowed"] = f"res-{rng.choice(owners)}"


def _pick(rng: random.Random, weighted: tuple[tuple[int, float], ...]) -> int:
    return rng.choices([value for value, _ in weighted], [weight for _, weight in weighted])[0]


def _time(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


if __name__ == "__main__":
    sys.exit(main())

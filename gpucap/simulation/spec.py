"""What a simulation is given beyond the arbiter's snapshot, and the checks of its input."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from gpucap.arbiter.model import Reservation, Snapshot
from gpucap.arbiter.topology import gpu_count_problem
from gpucap.arbiter.validation import snapshot_problems
from gpucap.simulation.profile import Profile


@dataclass(frozen=True)
class DeploymentSpec:
    """An inference deployment as the autoscaler and the router see it."""

    pool: str
    gpus_per_replica: int
    min_replicas: int = 0
    max_replicas: int = 1
    target_in_flight: int = 4
    replica_concurrency: int = 8
    queue_limit: int = 64
    scale_down_cooldown_seconds: int = 300
    tenant: str | None = None


def input_problems(
    start: Snapshot,
    profile: Profile,
    *,
    deployments: Mapping[str, DeploymentSpec],
    notice_seconds: int,
    step_seconds: int,
    duration_seconds: int,
    wait_threshold_seconds: float = 0,
    startup_seconds: int = 0,
    reservations: tuple[Reservation, ...] | None = None,
) -> list[str]:
    """Why this input cannot be simulated, one line each (empty: it can). ``reservations``:
    every reservation of the set, in force or not (None: the start's)."""
    if reservations is not None:
        start = replace(start, reservations=reservations)
    problems = [f"start: {problem}" for problem in snapshot_problems(start)]
    if start.now is None:
        problems.append("start: now is required: it is when the simulation starts")
    pools = {pool.name: pool for pool in start.pools}
    fabric = start.capacity_set.fabric
    for slug, spec in deployments.items():
        where = f"deployments.{slug}"
        if spec.pool not in pools:
            problems.append(f"{where}.pool: {spec.pool!r} is no pool of the set")
        size = gpu_count_problem(fabric, spec.gpus_per_replica)
        if size:
            problems.append(f"{where}.gpus_per_replica: {size}")
        if not 0 <= spec.min_replicas <= spec.max_replicas:
            problems.append(f"{where}: min_replicas must be 0..max_replicas")
        if not 1 <= spec.target_in_flight <= spec.replica_concurrency:
            problems.append(f"{where}: target_in_flight must be 1..replica_concurrency")
        if spec.queue_limit < 0 or spec.scale_down_cooldown_seconds < 0:
            problems.append(f"{where}: queue_limit and the cool-down must be 0 or more")
    for slug in profile.deployments:
        if slug not in deployments:
            problems.append(f"profile.deployments.{slug}: no such deployment in the set")
    for name, arrivals in profile.pools.items():
        if name not in pools:
            problems.append(f"profile.pools.{name}: no such pool in the set")
            continue
        size = gpu_count_problem(fabric, arrivals.gpus_per_vm)
        if size:
            problems.append(f"profile.pools.{name}.gpus_per_vm: {size}")
    if notice_seconds < 0:
        problems.append("notice_seconds: must be 0 or more")
    if step_seconds < 1:
        problems.append("step_seconds: must be 1 or more")
    if duration_seconds < 1:
        problems.append("duration_seconds: must be 1 or more")
    if wait_threshold_seconds < 0:
        problems.append("wait_threshold_seconds: must be 0 or more")
    if startup_seconds < 0:
        problems.append("startup_seconds: must be 0 or more")
    return problems

"""A capacity set, as it is now, handed to the load simulator (gpucap/simulation, issue 21).

The simulator is pure; this reads what it starts from: the set's snapshot with each pool's own
rank and floor (the simulator puts the schedule's values in force itself, step by step, from the
entries and overrides given with it), the set's inference deployments as the autoscaler and the
router see them, and its schedule. Nothing is stored or changed.
"""

from __future__ import annotations

import dataclasses

from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference.models import InferenceDeployment
from gpucap.plans.snapshot import capacity_set_snapshot
from gpucap.schedules.selectors import set_schedule
from gpucap.simulation import DeploymentSpec, Profile, SimulationResult, simulate


def simulate_set(
    capacity_set: CapacitySet,
    profile: Profile,
    *,
    step_seconds: int = 60,
    duration_seconds: int = 86400,
    wait_threshold_seconds: float = 1.0,
) -> SimulationResult:
    """Replay ``profile`` on the set as it is now, under its schedule and overrides."""
    snapshot = capacity_set_snapshot(capacity_set).snapshot
    own = {
        pool.name: (pool.rank, pool.floor_gpus)
        for pool in Pool.objects.filter(capacity_set=capacity_set)
    }
    start = dataclasses.replace(
        snapshot,
        pools=tuple(
            dataclasses.replace(pool, rank=own[pool.name][0], floor_gpus=own[pool.name][1])
            if pool.name in own
            else pool
            for pool in snapshot.pools
        ),
    )
    schedule = set_schedule(capacity_set)
    return simulate(
        start,
        profile,
        deployments=deployment_specs(capacity_set),
        entries=schedule.entries,
        overrides=schedule.overrides,
        notice_seconds=capacity_set.notice_seconds,
        step_seconds=step_seconds,
        duration_seconds=duration_seconds,
        wait_threshold_seconds=wait_threshold_seconds,
    )


def deployment_specs(capacity_set: CapacitySet) -> dict[str, DeploymentSpec]:
    """The set's inference deployments by slug, with their own replica range."""
    deployments = InferenceDeployment.objects.filter(
        pool__capacity_set=capacity_set
    ).select_related("pool", "tenant")
    return {
        d.slug: DeploymentSpec(
            pool=d.pool.name,
            gpus_per_replica=d.gpus_per_replica,
            min_replicas=d.min_replicas,
            max_replicas=d.max_replicas,
            target_in_flight=d.target_in_flight,
            replica_concurrency=d.replica_concurrency,
            queue_limit=d.queue_limit,
            scale_down_cooldown_seconds=d.scale_down_cooldown_seconds,
            tenant=d.tenant.slug,
        )
        for d in deployments.order_by("slug")
    }

"""A capacity set, as it is now, handed to the load simulator (gpucap/simulation, issue 21).

The simulator is pure; this reads what it starts from (`simulation_start`): the set's snapshot
with each pool's own rank and floor (the simulator puts the schedule's values in force itself,
step by step, from the entries and overrides given with it), the set's inference deployments as
the autoscaler and the router see them, and its schedule. Nothing is stored or changed.

A start is also stored with a simulation run (`start_to_dict` / `start_from_dict`), so the run
can be carried out later, or again, on exactly the set it was asked about.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, time

from gpucap.allocation.models import Reservation
from gpucap.allocation.selectors import reservation_window
from gpucap.arbiter import model as am
from gpucap.arbiter.codec import snapshot_from_dict, snapshot_to_dict
from gpucap.arbiter.model import Snapshot
from gpucap.fleet.models import CapacitySet
from gpucap.inference.models import InferenceDeployment
from gpucap.plans.snapshot import capacity_set_snapshot
from gpucap.schedules import calendar
from gpucap.schedules.selectors import set_schedule
from gpucap.simulation import DeploymentSpec, Profile, ReservationSpec, SimulationResult, simulate


@dataclass(frozen=True)
class SimulationStart:
    """What a simulation starts from: the set's snapshot (pools with their own ranks and
    floors), its deployments by slug, its schedule, its reservations with their windows (in
    force or not) and its notice period."""

    snapshot: Snapshot
    deployments: dict[str, DeploymentSpec]
    entries: tuple[calendar.Entry, ...]
    overrides: tuple[calendar.Override, ...]
    notice_seconds: int
    reservations: tuple[ReservationSpec, ...] = ()


def simulation_start(capacity_set: CapacitySet) -> SimulationStart:
    """The set as it is now, as the simulator starts from it."""
    read = capacity_set_snapshot(capacity_set)
    # The pools the snapshot read: their own rank and floor, not the ones in force now.
    own = {pool.name: (pool.rank, pool.floor_gpus) for pool in read.live.pools.values()}
    snapshot = dataclasses.replace(
        read.snapshot,
        pools=tuple(
            dataclasses.replace(pool, rank=own[pool.name][0], floor_gpus=own[pool.name][1])
            if pool.name in own
            else pool
            for pool in read.snapshot.pools
        ),
    )
    schedule = set_schedule(capacity_set)
    return SimulationStart(
        snapshot=snapshot,
        deployments=deployment_specs(capacity_set),
        entries=schedule.entries,
        overrides=schedule.overrides,
        notice_seconds=capacity_set.notice_seconds,
        reservations=reservation_specs(capacity_set),
    )


def reservation_specs(capacity_set: CapacitySet) -> tuple[ReservationSpec, ...]:
    """Every reservation of the set, oldest first, under the id and with the window the live
    snapshot gives it (gpucap.plans.reservation_feed)."""
    rows = Reservation.objects.filter(capacity_set=capacity_set).select_related("tenant")
    return tuple(
        ReservationSpec(
            am.Reservation(
                id=str(row.pk), tenant=row.tenant.slug, gpus=row.gpus, block_gpus=row.block_gpus
            ),
            reservation_window(row),
        )
        for row in rows.order_by("pk")
    )


def simulate_start(
    start: SimulationStart,
    profile: Profile,
    *,
    step_seconds: int = 60,
    duration_seconds: int = 86400,
    wait_threshold_seconds: float = 1.0,
    on_step: Callable[[int, int], None] | None = None,
) -> SimulationResult:
    """Replay ``profile`` from ``start``."""
    return simulate(
        start.snapshot,
        profile,
        deployments=start.deployments,
        entries=start.entries,
        overrides=start.overrides,
        reservations=start.reservations,
        notice_seconds=start.notice_seconds,
        step_seconds=step_seconds,
        duration_seconds=duration_seconds,
        wait_threshold_seconds=wait_threshold_seconds,
        on_step=on_step,
    )


def simulate_set(
    capacity_set: CapacitySet,
    profile: Profile,
    *,
    step_seconds: int = 60,
    duration_seconds: int = 86400,
    wait_threshold_seconds: float = 1.0,
) -> SimulationResult:
    """Replay ``profile`` on the set as it is now, under its schedule and overrides."""
    return simulate_start(
        simulation_start(capacity_set),
        profile,
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


# --- the stored form ------------------------------------------------------------------------------


def start_to_dict(start: SimulationStart) -> dict:
    """The JSON form of a start, which `start_from_dict` reads back to an equal start."""
    return {
        "snapshot": snapshot_to_dict(start.snapshot),
        "deployments": {slug: dataclasses.asdict(spec) for slug, spec in start.deployments.items()},
        "entries": [entry_to_dict(entry) for entry in start.entries],
        "overrides": [override_to_dict(override) for override in start.overrides],
        "notice_seconds": start.notice_seconds,
        "reservations": [_reservation_to_dict(spec) for spec in start.reservations],
    }


def start_from_dict(data: dict) -> SimulationStart:
    """A start stored by `start_to_dict` (raises on a form it did not write)."""
    return SimulationStart(
        snapshot=snapshot_from_dict(data["snapshot"]),
        deployments={slug: DeploymentSpec(**spec) for slug, spec in data["deployments"].items()},
        entries=tuple(entry_from_dict(entry) for entry in data["entries"]),
        overrides=tuple(override_from_dict(override) for override in data["overrides"]),
        notice_seconds=data["notice_seconds"],
        # Runs stored before reservations were simulated have none.
        reservations=tuple(_reservation_from_dict(r) for r in data.get("reservations", ())),
    )


def _reservation_to_dict(spec: ReservationSpec) -> dict:
    r = spec.reservation
    window = spec.window
    return {
        "id": r.id,
        "tenant": r.tenant,
        "gpus": r.gpus,
        "block_gpus": r.block_gpus,
        "window": None if window is None else _window_to_dict(window),
    }


def _reservation_from_dict(data: dict) -> ReservationSpec:
    window = data["window"]
    return ReservationSpec(
        am.Reservation(
            id=data["id"], tenant=data["tenant"], gpus=data["gpus"], block_gpus=data["block_gpus"]
        ),
        None if window is None else _window_from_dict(window),
    )


def entry_to_dict(entry: calendar.Entry) -> dict:
    return {
        "name": entry.name,
        **_window_to_dict(entry.window),
        "changes": [_change_to_dict(change) for change in entry.changes],
    }


def entry_from_dict(data: dict) -> calendar.Entry:
    return calendar.Entry(
        name=data["name"],
        window=_window_from_dict(data),
        changes=tuple(_change_from_dict(change) for change in data["changes"]),
    )


def _window_to_dict(window: calendar.Window) -> dict:
    return {
        "days": sorted(window.days),
        "start": window.start.isoformat(),
        "end": window.end.isoformat(),
        "time_zone": window.zone,
    }


def _window_from_dict(data: dict) -> calendar.Window:
    return calendar.Window(
        days=frozenset(data["days"]),
        start=time.fromisoformat(data["start"]),
        end=time.fromisoformat(data["end"]),
        zone=data["time_zone"],
    )


def override_to_dict(override: calendar.Override) -> dict:
    return {
        "name": override.name,
        "changes": [_change_to_dict(change) for change in override.changes],
        "expires_at": override.expires_at.isoformat(),
        "starts_at": override.starts_at.isoformat() if override.starts_at else None,
        "set_by": override.set_by,
    }


def override_from_dict(data: dict) -> calendar.Override:
    starts_at = data["starts_at"]
    return calendar.Override(
        name=data["name"],
        changes=tuple(_change_from_dict(change) for change in data["changes"]),
        expires_at=datetime.fromisoformat(data["expires_at"]),
        starts_at=datetime.fromisoformat(starts_at) if starts_at else None,
        set_by=data["set_by"],
    )


def _change_to_dict(change: calendar.Change) -> dict:
    value = list(change.value) if isinstance(change.value, tuple) else change.value
    return {"setting": change.setting, "target": change.target, "value": value}


def _change_from_dict(data: dict) -> calendar.Change:
    value = data["value"]
    return calendar.Change(
        data["setting"], data["target"], tuple(value) if isinstance(value, list) else value
    )

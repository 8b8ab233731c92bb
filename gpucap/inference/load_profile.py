"""A load profile recorded from what really happened (issue 21): a capacity set's deployments'
requests per second from the minutes kept by the load recorder (gpucap/inference/
load_history.py), and its spot and on-demand pools' VM requests from the rentals' own rows.

The result is a plain dict in the profile's JSON form (gpucap/simulation/profile.py), read back
by ``profile_from_dict``; its ``"notes"`` say what was missing or assumed, one sentence each.

Two ways to lay the days out (``fold``):

- ``"replay"``: the days as they were, time 0 = ``now - days``, a point a minute (deployments)
  or an hour (pools). A minute the recorder missed holds the rate before it (step curve).
- ``"day"``: folded into one day by time of day, per ``DAY_BUCKET_SECONDS`` (deployments) or
  per hour (pools), each bucket the mean over the days; the curve starts at ``now``'s time of
  day, so it lines up with a simulation starting now (after one day it holds the last rate). A
  deployment's bucket is its requests over the seconds recorded in it, so a gap counts neither
  as traffic nor as quiet; a pool's is the VMs asked for in it over ``days``.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from datetime import datetime, timedelta

from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference.models import InferenceDeployment, LoadMinute
from gpucap.rentals.models import VirtualMachine

FOLDS = ("day", "replay")
DAY = 86400
DAY_BUCKET_SECONDS = 600
POOL_BUCKET_SECONDS = 3600
DEFAULT_SERVICE_SECONDS = 1.0  # when no minute has both traffic and an in-flight sample
MIN_SERVICE_SECONDS = 0.01  # a profile's service time must be above 0
DEFAULT_DURATION_SECONDS = 3600.0  # a pool's VMs when none in the window has ended
MAX_GPUS_PER_VM = 8
ENDED = (VirtualMachine.State.STOPPED, VirtualMachine.State.TERMINATED)


def recorded_profile(capacity_set: CapacitySet, *, days: int, now: datetime, fold: str) -> dict:
    """The load of ``capacity_set`` over the ``days`` days before ``now``, as a profile dict.
    Deployments with no recorded minute and pools with no VM asked for are left out; the
    deployments left out are named in ``"notes"``. Three queries."""
    if fold not in FOLDS:
        raise ValueError(f"fold must be one of {', '.join(FOLDS)}; got {fold!r}")
    start = now - timedelta(days=days)
    notes: list[str] = [
        f"Recorded from {start:%Y-%m-%d %H:%M} to {now:%Y-%m-%d %H:%M} UTC ({days} days), "
        + (
            "folded into one day starting at now's time of day."
            if fold == "day"
            else "replayed as it was, time 0 being the window's start."
        )
    ]
    deployments = _deployments(
        capacity_set, start=start, now=now, days=days, fold=fold, notes=notes
    )
    pools = _pools(capacity_set, start=start, now=now, days=days, fold=fold, notes=notes)
    return {"deployments": deployments, "pools": pools, "notes": notes}


# --- deployments --------------------------------------------------------------------------------


def _deployments(capacity_set, *, start, now, days, fold, notes) -> dict:
    deployments = list(
        InferenceDeployment.objects.filter(pool__capacity_set=capacity_set)
        .order_by("slug")
        .values_list("pk", "slug")
    )
    minutes = defaultdict(list)
    for row in (
        LoadMinute.objects.filter(
            deployment__in=[pk for pk, _ in deployments], minute__gte=start, minute__lt=now
        )
        .order_by("minute")
        .values_list("deployment_id", "minute", "requests", "seconds", "in_flight_sampled")
    ):
        minutes[row[0]].append(row[1:])
    found = {}
    unrecorded = []
    for pk, slug in deployments:
        rows = minutes.get(pk)
        if not rows:
            unrecorded.append(slug)
            continue
        points = _folded_minutes(rows, now=now) if fold == "day" else _replayed_minutes(rows, start)
        service = _service_seconds(rows)
        if service is None:
            service = DEFAULT_SERVICE_SECONDS
            notes.append(
                f"{slug}: no minute with traffic had an in-flight sample, so its service time "
                f"is assumed to be {DEFAULT_SERVICE_SECONDS:g} s."
            )
        missing = days * DAY // 60 - len(rows)
        if missing > 0:
            notes.append(
                f"{slug}: {missing} of {days * DAY // 60} minutes were not recorded "
                "(no history yet, or the recorder was not running); the curve holds the rate "
                "before each gap."
            )
        found[slug] = {"shape": "step", "points": points, "service_seconds": service}
    if unrecorded:
        notes.append(f"Left out, with no recorded load in the window: {', '.join(unrecorded)}.")
    return found


def _replayed_minutes(rows, start: datetime) -> list[list[float]]:
    return _merged(
        [(minute - start).total_seconds(), requests / seconds]
        for minute, requests, seconds, _ in rows
    )


def _folded_minutes(rows, *, now: datetime) -> list[list[float]]:
    requests_in = defaultdict(int)
    seconds_in = defaultdict(int)
    for minute, requests, seconds, _ in rows:
        bucket = _time_of_day(minute) // DAY_BUCKET_SECONDS
        requests_in[bucket] += requests
        seconds_in[bucket] += seconds
    rates = {bucket: requests_in[bucket] / seconds_in[bucket] for bucket in seconds_in}
    return _from_now(rates, DAY_BUCKET_SECONDS, now=now)


def _service_seconds(rows) -> float | None:
    """Little's law over the sampled minutes: mean in flight / mean requests per second."""
    sampled = [(requests / seconds, n) for _, requests, seconds, n in rows if n is not None]
    throughput = sum(rate for rate, _ in sampled)
    if not sampled or throughput <= 0:
        return None
    in_flight = sum(n for _, n in sampled)
    return round(max(in_flight / throughput, MIN_SERVICE_SECONDS), 4)


# --- pools --------------------------------------------------------------------------------------


def _pools(capacity_set, *, start, now, days, fold, notes) -> dict:
    vms = defaultdict(list)
    for vm in (
        VirtualMachine.objects.filter(
            pool__capacity_set=capacity_set,
            pool__kind__in=[Pool.Kind.SPOT, Pool.Kind.ON_DEMAND],
            role=VirtualMachine.Role.RENTAL,
            created_at__gte=start,
            created_at__lt=now,
        )
        .select_related("pool", "tenant")
        .order_by("created_at", "pk")
    ):
        vms[vm.pool.name].append(vm)
    found = {}
    for name in sorted(vms):
        asked = vms[name]
        counts = Counter(vm.gpu_count for vm in asked)
        gpus = max(counts, key=lambda gpus: (counts[gpus], -gpus))
        tenants = Counter(vm.tenant.slug for vm in asked)
        ran = [
            (vm.stopped_at - vm.started_at).total_seconds()
            for vm in asked
            if vm.state in ENDED and vm.started_at and vm.stopped_at
        ]
        duration = statistics.median(ran) if ran else DEFAULT_DURATION_SECONDS
        if not ran:
            notes.append(
                f"{name}: none of its VMs asked for in the window has ended, so each is assumed "
                f"to run {DEFAULT_DURATION_SECONDS:g} s."
            )
        found[name] = {
            "shape": "step",
            "points": _pool_points([vm.created_at for vm in asked], start, now, days, fold),
            "gpus_per_vm": min(gpus, MAX_GPUS_PER_VM),
            "duration_seconds": max(duration, 1.0),
            "tenant": tenants.most_common(1)[0][0],
        }
    return found


def _pool_points(created, start, now, days, fold) -> list[list[float]]:
    """VMs asked for per hour: per hour of the window (replay), or per hour of the day over
    ``days`` (day)."""
    if fold == "day":
        per_hour = Counter(_time_of_day(at) // POOL_BUCKET_SECONDS for at in created)
        rates = {hour: per_hour[hour] / days for hour in range(DAY // POOL_BUCKET_SECONDS)}
        return _from_now(rates, POOL_BUCKET_SECONDS, now=now)
    per_hour = Counter(int((at - start).total_seconds()) // POOL_BUCKET_SECONDS for at in created)
    hours = int((now - start).total_seconds()) // POOL_BUCKET_SECONDS
    return _merged([hour * POOL_BUCKET_SECONDS, float(per_hour[hour])] for hour in range(hours))


# --- curves -------------------------------------------------------------------------------------


def _time_of_day(at: datetime) -> int:
    return int(at.timestamp()) % DAY


def _from_now(rates: dict[int, float], bucket_seconds: int, *, now: datetime) -> list[list[float]]:
    """A day of bucket rates (by bucket of the day) as a curve starting at ``now``'s time of
    day: time 0 has the rate of the bucket holding now, each later bucket starts where it falls
    after now. Buckets without a rate are left out (the curve holds the one before)."""
    offset = _time_of_day(now)
    current = offset // bucket_seconds
    points = []
    if current in rates:
        points.append([0.0, rates[current]])
    for bucket, rate in rates.items():
        if bucket == current:
            continue
        points.append([float((bucket * bucket_seconds - offset) % DAY), rate])
    points.sort()
    return _merged(points)


def _merged(points) -> list[list[float]]:
    """The points with each run of equal rates kept as its first point (a step curve says the
    same with fewer points)."""
    merged: list[list[float]] = []
    for time, rate in points:
        if merged and merged[-1][1] == rate:
            continue
        merged.append([float(time), float(rate)])
    return merged

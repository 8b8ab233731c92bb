"""Stored simulation runs (issue 21): asked for by an operator, carried out by a Celery task.

- `simulation_request` checks everything (the profile, the times, the edited configuration and
  whether the simulator can run it on the set) before it writes anything, captures what the run
  starts from (or reuses a stored run's start), stores the run queued and sends ``plans.simulate``.
- `simulation_carry_out` claims a run with a conditional update (a second worker, or the same
  message delivered again, does nothing), runs today's policy and the edited one, storing
  progress as it goes, and stores the results, or failed with the reason.
- A run whose worker was lost stays ``running`` with a heartbeat that no longer moves; after
  ``SIMULATION_STALE_SECONDS`` the next claim takes it over (the task's own retry, or the
  periodic `simulations_recover`), up to ``SIMULATION_MAX_ATTEMPTS`` claims.
"""

from __future__ import annotations

import json
import logging
import math
import time
from datetime import timedelta
from enum import StrEnum

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from gpucap.audit.services import Actor, audit_record
from gpucap.fleet.models import CapacitySet
from gpucap.plans.models import SimulationRun
from gpucap.plans.simulation import (
    SimulationStart,
    simulate_start,
    simulation_start,
    start_from_dict,
    start_to_dict,
)
from gpucap.plans.simulation_changes import ChangesError, changes_apply
from gpucap.simulation import (
    ProfileError,
    compare,
    input_problems,
    profile_from_dict,
    profile_from_json,
    result_to_dict,
)
from gpucap.tasks import enqueue_on_commit

logger = logging.getLogger(__name__)

MAX_HOURS = 168
STEP_RANGE = (10, 3600)
# Progress is stored every 5% of the steps, or at least this often (the claim's heartbeat).
HEARTBEAT_SECONDS = 10
TASK = "plans.simulate"


class Outcome(StrEnum):
    DONE = "done"
    FAILED = "failed"
    BUSY = "busy"  # another claim is carrying it out and shows progress
    NOTHING = "nothing"  # finished before, gone, or taken over while this claim ran


@transaction.atomic
def simulation_request(
    capacity_set: CapacitySet,
    *,
    profile: dict | str,
    changes: dict | None = None,
    name: str = "",
    hours: int = 24,
    step_seconds: int = 60,
    wait_threshold_seconds: float = 1.0,
    from_run: SimulationRun | None = None,
    by: Actor = None,
    send: bool = True,
) -> SimulationRun:
    """Store a run of ``profile`` on the set, queued, and send it to a worker (``send=False``:
    the caller carries it out itself, as ``manage.py simulate --store`` does)."""
    problems: dict[str, str] = {}
    read = _profile(profile, problems)
    if not isinstance(name, str) or len(name) > 120:
        problems["name"] = "must be text of at most 120 characters"
    if not _whole(hours) or not 1 <= hours <= MAX_HOURS:
        problems["hours"] = f"must be a whole number from 1 to {MAX_HOURS}, got {hours!r}"
    low, high = STEP_RANGE
    if not _whole(step_seconds) or not low <= step_seconds <= high:
        problems["step_seconds"] = (
            f"must be a whole number of seconds from {low} to {high}, got {step_seconds!r}"
        )
    elif "hours" not in problems and (hours * 3600) % step_seconds:
        problems["step_seconds"] = f"must divide the duration ({hours * 3600} s) evenly"
    if (
        isinstance(wait_threshold_seconds, bool)
        or not isinstance(wait_threshold_seconds, (int, float))
        or not 0 < wait_threshold_seconds <= 3600
        or not math.isfinite(wait_threshold_seconds)
    ):
        problems["wait_threshold_seconds"] = (
            f"must be a number of seconds above 0, at most 3600, got {wait_threshold_seconds!r}"
        )
    if from_run is not None and from_run.capacity_set_id != capacity_set.pk:
        problems["from_run"] = f"run {from_run.pk} is not a run of capacity set {capacity_set.name}"
    if changes is not None and not isinstance(changes, dict):
        problems["changes"] = "must be an object of pools, deployments and schedule"
    if problems:
        raise ValidationError(problems)
    start_data = (
        from_run.start if from_run is not None else start_to_dict(simulation_start(capacity_set))
    )
    start = start_from_dict(start_data)
    duration = hours * 3600
    _simulator_problems(start, read, step_seconds, duration, wait_threshold_seconds, "", problems)
    if changes:
        try:
            variant = changes_apply(start, changes)
        except ChangesError as error:
            problems.update(error.problems)
        else:
            _simulator_problems(
                variant, read, step_seconds, duration, wait_threshold_seconds, "changes", problems
            )
    if problems:
        raise ValidationError(problems)
    steps = duration // step_seconds
    run = SimulationRun.objects.create(
        capacity_set=capacity_set,
        requested_by=by if by is not None and by.is_authenticated else None,
        name=name,
        profile=json.loads(profile) if isinstance(profile, (str, bytes)) else profile,
        changes=changes or {},
        step_seconds=step_seconds,
        duration_seconds=duration,
        wait_threshold_seconds=float(wait_threshold_seconds),
        steps_total=steps * (2 if changes else 1),
        start=start_data,
    )
    audit_record(
        actor=by,
        verb="simulation.request",
        target=run,
        after={
            "name": name,
            "hours": hours,
            "step_seconds": step_seconds,
            "compares": bool(changes),
            "from_run": from_run.pk if from_run is not None else None,
        },
    )
    if send:
        enqueue_on_commit(TASK, run.pk)
    return run


def simulation_carry_out(*, run_id: int) -> Outcome:
    """Carry out the run if it is queued, or running under a claim that stopped showing
    progress. Never leaves it running on an error: it is stored failed with the reason."""
    attempt = _claim(run_id)
    if attempt is None:
        return _why_not(run_id)
    run = SimulationRun.objects.get(pk=run_id)
    progress = _Progress(run_id, attempt, run.steps_total)
    try:
        start = start_from_dict(run.start)
        profile = profile_from_dict(run.profile)
        today = _simulate(run, start, profile, progress)
        variant = None
        if run.changes:
            progress.offset = len(today.steps)
            variant = _simulate(run, changes_apply(start, run.changes), profile, progress)
        fields = {
            "result": result_to_dict(today),
            "variant_result": result_to_dict(variant) if variant is not None else None,
            "differences": [_difference(d) for d in compare(today, variant)] if variant else [],
            "steps_done": run.steps_total,
        }
        outcome, error = Outcome.DONE, ""
    except _Lost:
        logger.warning("simulation %s: claim %s was taken over; stopping", run_id, attempt)
        return Outcome.NOTHING
    except Exception as exc:  # a bug met by chance, a start it cannot read: say why, stop
        logger.exception("simulation %s failed", run_id)
        outcome, error, fields = Outcome.FAILED, f"{type(exc).__name__}: {exc}"[:2000], {}
    finished = _claimed(run_id, attempt).update(
        state=outcome.value, error=error, finished_at=timezone.now(), **fields
    )
    return outcome if finished else Outcome.NOTHING


def simulations_recover() -> int:
    """Send the task again for runs whose worker was lost (running, no progress for
    ``SIMULATION_STALE_SECONDS``) or whose message was (queued that long); fail those that
    used up their claims. Returns how many were sent."""
    stale = timezone.now() - timedelta(seconds=settings.SIMULATION_STALE_SECONDS)
    _give_up(SimulationRun.objects.all(), stale)
    lost = list(
        SimulationRun.objects.filter(
            Q(state=SimulationRun.State.RUNNING, heartbeat_at__lt=stale)
            | Q(state=SimulationRun.State.QUEUED, created_at__lt=stale)
        ).values_list("pk", flat=True)
    )
    for run_id in lost:
        enqueue_on_commit(TASK, run_id)
    return len(lost)


# --- helpers ------------------------------------------------------------------------------------


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _profile(profile: object, problems: dict[str, str]):
    try:
        if isinstance(profile, (str, bytes)):
            return profile_from_json(profile)
        return profile_from_dict(profile)
    except ProfileError as error:
        for field, reason in error.problems.items():
            problems[field if field == "profile" else f"profile.{field}"] = reason
    return None


def _simulator_problems(
    start: SimulationStart,
    profile,
    step_seconds: int,
    duration: int,
    threshold: float,
    prefix: str,
    problems: dict[str, str],
) -> None:
    """The simulator's own checks of the input, by field (``profile.deployments.x``)."""
    if profile is None:
        return
    for line in input_problems(
        start.snapshot,
        profile,
        deployments=start.deployments,
        notice_seconds=start.notice_seconds,
        step_seconds=step_seconds,
        duration_seconds=duration,
        wait_threshold_seconds=threshold,
    ):
        field, _, reason = line.partition(": ")
        if prefix:
            field = prefix if field == "start" else f"{prefix}.{field}"
        problems.setdefault(field, reason)


def _claimed(run_id: int, attempt: int):
    return SimulationRun.objects.filter(
        pk=run_id, state=SimulationRun.State.RUNNING, attempts=attempt
    )


def _claim(run_id: int) -> int | None:
    """Take the run (queued, or running under a stale claim): the claim's number, or None."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.SIMULATION_STALE_SECONDS)
    claimable = Q(state=SimulationRun.State.QUEUED) | Q(
        state=SimulationRun.State.RUNNING, heartbeat_at__lt=stale
    )
    taken = (
        SimulationRun.objects.filter(claimable, pk=run_id)
        .filter(attempts__lt=settings.SIMULATION_MAX_ATTEMPTS)
        .update(
            state=SimulationRun.State.RUNNING,
            attempts=F("attempts") + 1,
            started_at=now,
            heartbeat_at=now,
            steps_done=0,
        )
    )
    if not taken:
        return None
    return SimulationRun.objects.filter(pk=run_id).values_list("attempts", flat=True)[0]


def _why_not(run_id: int) -> Outcome:
    state = SimulationRun.objects.filter(pk=run_id).values_list("state", flat=True).first()
    if state != SimulationRun.State.RUNNING:
        return Outcome.NOTHING
    stale = timezone.now() - timedelta(seconds=settings.SIMULATION_STALE_SECONDS)
    # Lost with every claim used up: failed now, rather than running for ever.
    _give_up(SimulationRun.objects.filter(pk=run_id), stale)
    return Outcome.BUSY


def _give_up(runs, stale) -> int:
    return runs.filter(
        state=SimulationRun.State.RUNNING,
        heartbeat_at__lt=stale,
        attempts__gte=settings.SIMULATION_MAX_ATTEMPTS,
    ).update(
        state=SimulationRun.State.FAILED,
        finished_at=timezone.now(),
        error=f"its worker was lost {settings.SIMULATION_MAX_ATTEMPTS} times; not tried again",
    )


class _Lost(Exception):
    """Another claim took the run over: this one stops without writing."""


class _Progress:
    """``on_step`` for the simulator: stores steps done every 5% (and the claim's heartbeat at
    least every HEARTBEAT_SECONDS) with a conditional update that also tells whether the claim
    still holds."""

    def __init__(self, run_id: int, attempt: int, total: int) -> None:
        self.run_id, self.attempt, self.total = run_id, attempt, total
        self.every = max(1, math.ceil(total / 20))
        self.offset = 0
        self.stored = 0
        self.beat = time.monotonic()

    def __call__(self, done: int, _steps: int) -> None:
        overall = min(self.offset + done, self.total)
        due = overall - self.stored >= self.every
        if not due and time.monotonic() - self.beat < HEARTBEAT_SECONDS:
            return
        if not _claimed(self.run_id, self.attempt).update(
            steps_done=overall, heartbeat_at=timezone.now()
        ):
            raise _Lost
        self.stored, self.beat = overall, time.monotonic()


def _simulate(run: SimulationRun, start: SimulationStart, profile, progress: _Progress):
    return simulate_start(
        start,
        profile,
        step_seconds=run.step_seconds,
        duration_seconds=run.duration_seconds,
        wait_threshold_seconds=run.wait_threshold_seconds,
        on_step=progress,
    )


def _difference(difference) -> dict:
    return {
        "key": difference.before.key,
        "label": difference.label,
        "before": difference.before.shown(),
        "after": difference.after.shown(),
        "before_value": difference.before.value,
        "after_value": difference.after.value,
        "unit": difference.before.unit,
        "text": str(difference),
    }

"""Every change to a capacity set's schedule and overrides, and the application of what is in
force (`policy_apply`).

Writing an entry or an override is validated whole before anything is written: its window, what
it sets (gpucap/schedules/spec.py), and that no other entry (or override) sets the same value
while both are open, which is refused naming both. Then the set's policy is applied at once.

`policy_apply` computes the policy in force now (gpucap/schedules/calendar.py) and writes it into
the pools' and deployments' ``scheduled_*`` columns; when a value changed it bumps the set's
generation (so the arbiter plans again with it, and a plan made before can no longer be
approved) and records each change in the audit log, with the entry or override it comes from.
Expired overrides are deleted then (audited too). It runs at every boundary: sent for that
moment when the boundary is known (`wake_at`), and by beat (``schedules.apply_due``) as the
safety net, for the sets whose boundary passed since their last apply (`AppliedPolicy`). It is
idempotent: run twice at one moment, the second changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from gpucap.audit.services import Actor, audit_record
from gpucap.fleet import services as fleet
from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference.models import InferenceDeployment
from gpucap.schedules import calendar, spec
from gpucap.schedules.models import AppliedPolicy, PolicyChange, PolicyOverride, ScheduleEntry
from gpucap.schedules.selectors import (
    LOOKAHEAD,
    SetSchedule,
    entry_of,
    override_of,
    set_schedule,
)
from gpucap.tasks import enqueue_on_commit, wake_at


@transaction.atomic
def schedule_entry_save(
    *, capacity_set: CapacitySet, data: Mapping, actor: Actor = None, now: datetime | None = None
) -> ScheduleEntry:
    """Create the entry ``data["name"]`` of the set, or replace the one of that name."""
    now = now or timezone.now()
    fleet.lock_set(capacity_set)
    problems: dict[str, str] = {}
    name = data.get("name")
    if problem := spec.name_problem(name):
        problems["name"] = problem
    for key in data:
        if key not in ("name", *spec.WINDOW_FIELDS, *spec.CHANGE_FIELDS):
            problems[key] = "is not a field of a schedule entry"
    window = spec.read_window(data, problems)
    changes = _read_changes(capacity_set, data, problems)
    if problems:
        raise ValidationError(problems)
    entry = calendar.Entry(name=name, window=window, changes=spec.as_calendar_changes(changes))
    schedule = set_schedule(capacity_set)  # read once: the conflicts, the row, then the apply
    others = [e for e in schedule.entries if e.name != name]
    clashes = calendar.conflicts([*others, entry], now)
    if clashes:
        raise ValidationError(
            {"non_field_errors": [clash.describe(window.zone) for clash in clashes]}
        )
    row = next((row for row in schedule.entry_rows if row.name == name), None)
    before = _entry_words(row) if row else {}
    if row is None:
        row = ScheduleEntry(capacity_set=capacity_set, name=name, created_by=_user(actor))
    row.days = sorted(window.days)
    row.start_time, row.end_time, row.time_zone = window.start, window.end, window.zone
    row.save()
    row.changes.all().delete()
    _write_changes(changes, entry=row)
    audit_record(
        actor=actor,
        verb="schedule_entry.update" if before else "schedule_entry.create",
        target=row,
        before=before,
        after={"window": window.describe(), "sets": [c.describe() for c in entry.changes]},
    )
    entries = tuple(sorted([*others, entry], key=lambda e: e.name))
    policy_apply(
        capacity_set=capacity_set, now=now, actor=actor, schedule=replace(schedule, entries=entries)
    )
    return row


@transaction.atomic
def schedule_entry_delete(
    *, entry: ScheduleEntry, actor: Actor = None, now: datetime | None = None
) -> None:
    capacity_set = entry.capacity_set
    fleet.lock_set(capacity_set)
    before = _entry_words(entry)
    audit_record(actor=actor, verb="schedule_entry.delete", target=entry, before=before)
    entry.delete()
    policy_apply(capacity_set=capacity_set, now=now or timezone.now(), actor=actor)


@transaction.atomic
def policy_override_set(
    *,
    capacity_set: CapacitySet,
    data: Mapping,
    actor: Actor = None,
    now: datetime | None = None,
) -> PolicyOverride:
    """Set (or replace, by name) a temporary override of the set's policy. ``data``: ``name``,
    what it sets (as an entry does), ``expires_at`` or ``ttl_seconds``, optionally
    ``starts_at`` and ``reason``."""
    now = now or timezone.now()
    fleet.lock_set(capacity_set)
    problems: dict[str, str] = {}
    name = data.get("name")
    if problem := spec.name_problem(name):
        problems["name"] = problem
    allowed = ("name", "expires_at", "ttl_seconds", "starts_at", "reason", *spec.CHANGE_FIELDS)
    for key in data:
        if key not in allowed:
            problems[key] = "is not a field of an override"
    starts_at, expires_at = spec.read_override_times(data, now, problems)
    reason = data.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 200:
        problems["reason"] = "must be text of at most 200 characters"
    changes = _read_changes(capacity_set, data, problems)
    if problems:
        raise ValidationError(problems)
    set_by = actor.get_username() if actor is not None and actor.is_authenticated else "system"
    candidate = calendar.Override(
        name=name,
        changes=spec.as_calendar_changes(changes),
        expires_at=expires_at,
        starts_at=starts_at,
        set_by=set_by,
    )
    rows = PolicyOverride.objects.filter(capacity_set=capacity_set, expires_at__gt=now)
    for other in (override_of(row) for row in rows.exclude(name=name)):
        shared = {c.key for c in other.changes} & {c.key for c in candidate.changes}
        overlap = (other.starts_at or now) < expires_at and (starts_at or now) < other.expires_at
        if shared and overlap:
            setting, target = sorted(shared)[0]
            raise ValidationError(
                {
                    "non_field_errors": (
                        f'override "{other.name}" (set by {other.set_by}, until '
                        f"{other.expires_at:%Y-%m-%d %H:%M} UTC) already sets "
                        f"{_setting_words(setting, target)}; clear it or wait for it to expire"
                    )
                }
            )
    row = PolicyOverride.objects.filter(capacity_set=capacity_set, name=name).first()
    if row is None:
        row = PolicyOverride(capacity_set=capacity_set, name=name)
    row.starts_at, row.expires_at, row.reason = starts_at, expires_at, reason
    row.set_by, row.set_by_user = set_by, _user(actor)
    row.save()
    row.changes.all().delete()
    _write_changes(changes, override=row)
    audit_record(
        actor=actor,
        verb="policy_override.set",
        target=row,
        after={
            "sets": [c.describe() for c in candidate.changes],
            "starts_at": starts_at.isoformat() if starts_at else None,
            "expires_at": expires_at.isoformat(),
            "reason": reason,
        },
    )
    policy_apply(capacity_set=capacity_set, now=now, actor=actor)
    return row


@transaction.atomic
def policy_override_clear(
    *, override: PolicyOverride, actor: Actor = None, now: datetime | None = None
) -> None:
    capacity_set = override.capacity_set
    fleet.lock_set(capacity_set)
    audit_record(actor=actor, verb="policy_override.clear", target=override)
    override.delete()
    policy_apply(capacity_set=capacity_set, now=now or timezone.now(), actor=actor)


@transaction.atomic
def policy_apply(
    *,
    capacity_set: CapacitySet,
    now: datetime,
    actor: Actor = None,
    schedule: SetSchedule | None = None,
) -> list[str]:
    """Put in force what the set's schedule and overrides say at ``now``; the changes made, in
    words (empty: nothing changed). ``schedule``: the set's, as a write under the set's lock
    has just made it (spares reading it again)."""
    locked = CapacitySet.objects.select_for_update().only("generation").get(pk=capacity_set.pk)
    for expired in PolicyOverride.objects.filter(capacity_set=capacity_set, expires_at__lte=now):
        audit_record(
            actor=None,
            verb="policy_override.expire",
            target=expired,
            message=f"expired at {expired.expires_at:%Y-%m-%d %H:%M:%S} UTC",
        )
        expired.delete()
    if schedule is None:
        schedule = set_schedule(capacity_set)
    else:
        live = tuple(o for o in schedule.overrides if o.expires_at > now)
        schedule = replace(schedule, overrides=live)
    policy = schedule.policy_at(now)
    words = _write_policy(capacity_set, policy)
    if words:
        fleet.capacity_set_bump(capacity_set_id=capacity_set.pk)
        audit_record(
            actor=actor,
            verb="policy.apply",
            target=capacity_set,
            after={"changes": words, "sources": _sources(policy)},
            message="; ".join(words),
        )
    following = schedule.next_boundary(now)
    if following is not None:
        wake_at("schedules.apply", capacity_set.pk, following)
    # The row lock is held: the bump above is the only change to the generation since.
    AppliedPolicy.objects.update_or_create(
        capacity_set=capacity_set,
        defaults={
            "applied_at": now,
            "generation": locked.generation + (1 if words else 0),
            "next_boundary": following or now + LOOKAHEAD,
        },
    )
    return words


def policies_apply_due(*, now: datetime | None = None) -> int:
    """`policy_apply` for every set with a schedule, an override or values still in force from
    one (beat's safety net under the boundary wake-ups), that has something new to apply: a
    boundary passed since its last apply (one whose wake-up was lost, or passed while beat was
    down), its generation moved since, or it was never applied. One query when none has.
    Returns how many sets changed."""
    now = now or timezone.now()
    sets = CapacitySet.objects.filter(
        Q(schedule_entries__isnull=False)
        | Q(policy_overrides__isnull=False)
        | Q(pools__scheduled_rank__isnull=False)
        | Q(pools__scheduled_floor_gpus__isnull=False)
        | Q(pools__deployments__scheduled_min_replicas__isnull=False)
        | Q(pools__deployments__scheduled_max_replicas__isnull=False)
    ).filter(
        Q(applied_policy__isnull=True)
        | Q(applied_policy__next_boundary__lte=now)
        | ~Q(applied_policy__generation=F("generation"))
    )
    due = sets.distinct().order_by("pk")
    return sum(1 for capacity_set in due if policy_apply(capacity_set=capacity_set, now=now))


def _write_policy(capacity_set: CapacitySet, policy: calendar.Policy) -> list[str]:
    """Write ``policy`` into the set's ``scheduled_*`` columns; what changed in force, in the
    words of `calendar.Policy.differences` (the timeline's and the policy API's too)."""
    pools = list(
        Pool.objects.filter(capacity_set=capacity_set).select_for_update().order_by("rank")
    )
    deployments = list(
        InferenceDeployment.objects.filter(pool__capacity_set=capacity_set)
        .select_for_update(of=("self",))
        .order_by("slug")
    )
    before = _in_force(pools, deployments, policy.at)
    for pool in pools:
        rank = policy.ranks.get(pool.name, pool.rank)
        scheduled_rank = None if rank == pool.rank else rank
        in_force = (calendar.FLOOR_GPUS, pool.name) in policy.sources
        scheduled_floor = policy.floors[pool.name] if in_force else None
        if (pool.scheduled_rank, pool.scheduled_floor_gpus) != (scheduled_rank, scheduled_floor):
            pool.scheduled_rank, pool.scheduled_floor_gpus = scheduled_rank, scheduled_floor
            pool.save(update_fields=["scheduled_rank", "scheduled_floor_gpus"])
    for deployment in deployments:
        low, high = policy.replicas.get(
            deployment.slug, (deployment.min_replicas, deployment.max_replicas)
        )
        scheduled = (
            low if (calendar.MIN_REPLICAS, deployment.slug) in policy.sources else None,
            high if (calendar.MAX_REPLICAS, deployment.slug) in policy.sources else None,
        )
        if (deployment.scheduled_min_replicas, deployment.scheduled_max_replicas) != scheduled:
            deployment.scheduled_min_replicas, deployment.scheduled_max_replicas = scheduled
            deployment.save(update_fields=["scheduled_min_replicas", "scheduled_max_replicas"])
    after = _in_force(pools, deployments, policy.at)
    for slug in sorted(after.replicas):
        if before.replicas[slug] != after.replicas[slug]:
            # The autoscaler asks for the replicas a raised minimum needs (or lets go of those
            # a lowered maximum leaves over) now, not at its next periodic run.
            enqueue_on_commit("inference.wake", slug)
    return before.differences(after)


def _in_force(
    pools: list[Pool], deployments: list[InferenceDeployment], at: datetime
) -> calendar.Policy:
    """What the rows hold in force, as a policy (to say what changed in `Policy`'s words)."""
    return calendar.Policy(
        at=at,
        ranks={pool.name: pool.rank_in_force for pool in pools},
        floors={pool.name: pool.floor_in_force for pool in pools},
        replicas={d.slug: (d.min_replicas_in_force, d.max_replicas_in_force) for d in deployments},
        sources={},
    )


def _read_changes(
    capacity_set: CapacitySet, data: Mapping, problems: dict[str, str]
) -> list[spec.ChangeSpec]:
    pools = {pool.name: pool for pool in Pool.objects.filter(capacity_set=capacity_set)}
    deployments = {
        d.slug: d for d in InferenceDeployment.objects.filter(pool__capacity_set=capacity_set)
    }
    set_gpus = fleet.capacity_set_gpu_total(capacity_set=capacity_set)
    changes = spec.read_changes(
        data, pools=pools, deployments=deployments, set_gpus=set_gpus, problems=problems
    )
    floors = {pool.name: pool.floor_gpus for pool in pools.values()}
    floors.update(
        {c.pool.name: c.value for c in changes if c.setting == PolicyChange.Setting.FLOOR_GPUS}
    )
    if sum(floors.values()) > set_gpus and not problems:
        problems["pools"] = (
            f"floors would add up to {sum(floors.values())} GPUs while this is in force; the set "
            f"has {set_gpus}"
        )
    return changes


def _write_changes(
    changes: list[spec.ChangeSpec],
    *,
    entry: ScheduleEntry | None = None,
    override: PolicyOverride | None = None,
) -> None:
    PolicyChange.objects.bulk_create(
        PolicyChange(
            entry=entry,
            override=override,
            setting=change.setting,
            pool=change.pool,
            deployment=change.deployment,
            value=change.value,
            position=change.position,
        )
        for change in changes
    )


def _entry_words(row: ScheduleEntry) -> dict:
    entry = entry_of(row)
    return {"window": entry.window.describe(), "sets": [c.describe() for c in entry.changes]}


def _sources(policy: calendar.Policy) -> dict[str, str]:
    return {_setting_words(*key): source for key, source in policy.sources.items()}


def _setting_words(setting: str, target: str) -> str:
    if setting == calendar.RANK_ORDER:
        return "the rank order"
    owner = "pool" if setting == calendar.FLOOR_GPUS else "deployment"
    return f"{owner} {target}'s {setting}"


def _user(actor: Actor):
    return actor if actor is not None and actor.is_authenticated else None

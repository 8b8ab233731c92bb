"""Reads of a capacity set's schedule: its entries and overrides as the calendar sees them, and
the policy in force at any instant (a fixed number of queries whatever the schedule's size)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Prefetch

from gpucap.fleet.models import CapacitySet, Pool
from gpucap.inference.models import InferenceDeployment
from gpucap.schedules import calendar
from gpucap.schedules.models import PolicyChange, PolicyOverride, ScheduleEntry

# How far ahead the next boundary is looked for (a weekly calendar repeats within 8 days).
LOOKAHEAD = timedelta(days=8)


@dataclass(frozen=True)
class SetSchedule:
    """A set's own values, schedule entries and overrides, read once."""

    capacity_set: CapacitySet
    base: calendar.Base
    entries: tuple[calendar.Entry, ...]
    overrides: tuple[calendar.Override, ...]
    entry_rows: tuple[ScheduleEntry, ...]
    override_rows: tuple[PolicyOverride, ...]

    def policy_at(self, at: datetime) -> calendar.Policy:
        return calendar.effective(self.base, self.entries, self.overrides, at)

    def boundaries(self, since: datetime, until: datetime) -> list[datetime]:
        return calendar.boundaries(self.entries, self.overrides, since, until)

    def next_boundary(self, after: datetime) -> datetime | None:
        """The next boundary that changes something: a value in force, or an override starting
        or expiring (expired ones are deleted then). One entry closing as another opens with
        the same values changes nothing: no wake-up is needed for it."""
        in_force = self.policy_at(after)
        override_moments = {
            moment for o in self.overrides for moment in (o.starts_at, o.expires_at) if moment
        }
        for moment in self.boundaries(after, after + LOOKAHEAD):
            if moment in override_moments or in_force.differences(self.policy_at(moment)):
                return moment
        return None

    @property
    def empty(self) -> bool:
        return not self.entries and not self.overrides


def set_schedule(capacity_set: CapacitySet) -> SetSchedule:
    """The set's schedule as the calendar reads it (four queries)."""
    pools = list(Pool.objects.filter(capacity_set=capacity_set).order_by("rank"))
    deployments = list(
        InferenceDeployment.objects.filter(pool__capacity_set=capacity_set).order_by("slug")
    )
    changes = PolicyChange.objects.select_related("pool", "deployment").order_by("pk")
    entries = list(
        ScheduleEntry.objects.filter(capacity_set=capacity_set)
        .prefetch_related(Prefetch("changes", queryset=changes))
        .order_by("name")
    )
    overrides = list(
        PolicyOverride.objects.filter(capacity_set=capacity_set)
        .prefetch_related(Prefetch("changes", queryset=changes))
        .order_by("name")
    )
    base = calendar.Base(
        pools={pool.name: (pool.rank, pool.floor_gpus) for pool in pools},
        deployments={d.slug: (d.min_replicas, d.max_replicas) for d in deployments},
    )
    return SetSchedule(
        capacity_set=capacity_set,
        base=base,
        entries=tuple(entry_of(row) for row in entries),
        overrides=tuple(override_of(row) for row in overrides),
        entry_rows=tuple(entries),
        override_rows=tuple(overrides),
    )


def entry_of(row: ScheduleEntry) -> calendar.Entry:
    window = calendar.Window(
        days=frozenset(row.days), start=row.start_time, end=row.end_time, zone=row.time_zone
    )
    return calendar.Entry(name=row.name, window=window, changes=changes_of(row.changes.all()))


def override_of(row: PolicyOverride) -> calendar.Override:
    return calendar.Override(
        name=row.name,
        changes=changes_of(row.changes.all()),
        expires_at=row.expires_at,
        starts_at=row.starts_at,
        set_by=row.set_by,
    )


def changes_of(rows) -> tuple[calendar.Change, ...]:
    changes = []
    order = []
    for row in rows:
        if row.setting == PolicyChange.Setting.RANK_ORDER:
            order.append((row.position, row.pool.name))
        elif row.setting == PolicyChange.Setting.FLOOR_GPUS:
            changes.append(calendar.Change(row.setting, row.pool.name, row.value))
        else:
            changes.append(calendar.Change(row.setting, row.deployment.slug, row.value))
    if order:
        names = tuple(name for _, name in sorted(order))
        changes.append(calendar.Change(calendar.RANK_ORDER, "", names))
    return tuple(changes)

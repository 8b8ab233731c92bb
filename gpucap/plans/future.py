"""What the arbiter would do later today: the plan at an instant ``at`` on today's fleet with the
policy in force at ``at`` (the set's schedule and overrides, gpucap/schedules), and the set
page's timeline of the next 24 hours, one such plan at each boundary.

A dry run: nothing is stored, nobody is notified. The fleet is today's (the VMs running and
pending now, as the set's kept snapshot has them, gpucap/plans/snapshot_cache.py); what differs
at ``at`` is the policy (ranks, floors, minimum replicas: `snapshot.with_policy`), the replicas
a raised minimum would ask for, and the clock (protection windows run out by then). It is how
an operator checks a schedule, or an outside scheduler's overrides, before trusting it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from gpucap import arbiter
from gpucap.arbiter import model as am
from gpucap.fleet.models import CapacitySet
from gpucap.gcpause import collector_paused
from gpucap.plans import snapshot_cache
from gpucap.plans.services import consistent_snapshot
from gpucap.plans.snapshot import SCHEDULED_PREFIX, SetSnapshot, with_policy
from gpucap.schedules import calendar
from gpucap.schedules.selectors import SetSchedule, set_schedule

HOURS = 24


@dataclass(frozen=True)
class Served:
    """A demand the plan would place: a pending VM, or replicas a raised minimum asks for."""

    demand: str
    pool: str
    node: str
    gpus: tuple[int, ...]

    @property
    def scheduled(self) -> bool:
        """Asked for by a deployment's minimum in force then (no VM exists for it yet)."""
        return self.demand.startswith(SCHEDULED_PREFIX)


@dataclass(frozen=True)
class FuturePlan:
    """The arbiter's plan at ``at`` with ``policy`` in force, on today's fleet."""

    at: datetime
    policy: calendar.Policy
    plan: am.Plan
    demands: tuple[am.Demand, ...]  # the snapshot's at ``at``: the pending VMs', then the asked-for

    @property
    def victims(self) -> tuple[am.Preemption, ...]:
        """Who would get notices: tenant, pool, node, GPUs, and why."""
        return self.plan.preemptions

    @property
    def served(self) -> list[Served]:
        pools = {demand.id: demand.pool for demand in self.demands}
        return [
            Served(demand=p.demand, pool=pools.get(p.demand, ""), node=p.node, gpus=p.gpus)
            for p in self.plan.placements
        ]

    @property
    def unsatisfied(self) -> tuple[am.Unsatisfied, ...]:
        return self.plan.unsatisfied

    @property
    def victim_gpus(self) -> int:
        return sum(len(victim.gpus) for victim in self.victims)


@dataclass(frozen=True)
class Boundary:
    """One boundary of the timeline: when, what opens or closes then (with the entry's zone),
    what changes, in words, and the plan at that moment."""

    at: datetime
    events: list[tuple[str, str]]  # (what happens, the time on the wall clock it is read on)
    changes: list[str]
    future: FuturePlan


def plan_at(
    capacity_set: CapacitySet,
    at: datetime,
    *,
    schedule: SetSchedule | None = None,
    snap: SetSnapshot | None = None,
) -> FuturePlan:
    """What the arbiter would do at ``at`` on today's fleet with the policy in force then.
    ``schedule`` and ``snap`` spare reading them again (the timeline reads them once)."""
    schedule = schedule or set_schedule(capacity_set)
    snap = snap or _today(capacity_set)
    policy = schedule.policy_at(at)
    then = with_policy(snap, policy, at)
    with collector_paused():  # see gpucap/gcpause.py
        result = arbiter.plan(then.snapshot)
    return FuturePlan(at=at, policy=policy, plan=result, demands=then.snapshot.demands)


def timeline(capacity_set: CapacitySet, now: datetime, hours: int = HOURS) -> list[Boundary]:
    """Each boundary of the set's schedule and overrides in ``(now, now + hours]`` that changes
    something in force: what changes then and `plan_at` that moment. One read of the schedule
    and of the fleet; a plan each."""
    schedule = set_schedule(capacity_set)
    until = now + timedelta(hours=hours)
    moments = schedule.boundaries(now, until)
    if not moments:
        return []
    snap = _today(capacity_set)
    events = _events(schedule, now, until)
    before = schedule.policy_at(now)
    found = []
    for moment in moments:
        changes = before.differences(schedule.policy_at(moment))
        if not changes:
            continue  # e.g. one entry closes as another opens with the same values
        future = plan_at(capacity_set, moment, schedule=schedule, snap=snap)
        found.append(
            Boundary(at=moment, events=events.get(moment, []), changes=changes, future=future)
        )
        before = future.policy
    return found


def _today(capacity_set: CapacitySet) -> SetSnapshot:
    with collector_paused():
        return snapshot_cache.set_snapshot(capacity_set, load=consistent_snapshot)


def _events(
    schedule: SetSchedule, since: datetime, until: datetime
) -> dict[datetime, list[tuple[str, str]]]:
    """What opens, closes, starts or expires at each instant, with the wall-clock time it reads
    in the entry's zone (an override's in UTC)."""
    found: dict[datetime, list[tuple[str, str]]] = {}
    end = until + timedelta(microseconds=1)
    for entry in schedule.entries:
        zone = entry.window.zone
        for opens, closes in entry.window.occurrences(since, end):
            for moment, verb in ((opens, "opens"), (closes, "closes")):
                if since < moment <= until:
                    found.setdefault(moment, []).append(
                        (f'entry "{entry.name}" {verb}', _wall(moment, zone))
                    )
    for override in schedule.overrides:
        by = f" (set by {override.set_by})" if override.set_by else ""
        for moment, verb in ((override.starts_at, "starts"), (override.expires_at, "expires")):
            if moment is not None and since < moment <= until:
                found.setdefault(moment, []).append(
                    (f'override "{override.name}"{by} {verb}', _wall(moment, "UTC"))
                )
    return found


def _wall(moment: datetime, zone: str) -> str:
    return moment.astimezone(ZoneInfo(zone)).strftime(f"%a %H:%M {zone}")

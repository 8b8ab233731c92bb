"""Weekly windows on a wall clock, and the policy they put in force (plain Python, no Django).

A schedule entry is active during a weekly `Window`: on some days of the week, from a start to
an end time, read on the wall clock of an IANA time zone ("08:00-20:00 Mon-Fri
America/New_York"). The window is what a person reading that calendar expects:

- The days are the days the window *starts* on. An end at or before the start means the window
  crosses midnight and ends the next day ("22:00-06:00 Fri" ends Saturday 06:00); an end equal
  to the start lasts a whole day.
- Times are local: across a daylight-saving change a window still opens and closes at the same
  wall-clock times, so it lasts an hour more or less in real time that day.
- A time the clock skips (02:30 when clocks jump from 02:00 to 03:00) is passed at the jump: a
  window starting then starts at 03:00. A time the clock shows twice (01:30 when clocks fall back
  from 02:00 to 01:00) is its first showing.

`effective` computes the policy in force at an instant from a set's own values, its entries and
its temporary overrides (an override wins over an entry, an entry over the set's own value);
`conflicts` finds entries that would set the same value at the same time, which writes refuse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, available_timezones

DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
# What `conflicts` looks at: a year and a week covers every daylight-saving rule of every zone
# (they repeat yearly) and every weekday of each.
CONFLICT_HORIZON = timedelta(days=372)

# The settings a schedule entry or an override may change.
FLOOR_GPUS = "floor_gpus"  # a pool's floor
MIN_REPLICAS = "min_replicas"  # a deployment's range
MAX_REPLICAS = "max_replicas"
RANK_ORDER = "rank_order"  # the order of some of the set's pools
SETTINGS = (FLOOR_GPUS, MIN_REPLICAS, MAX_REPLICAS, RANK_ORDER)


def zone_problem(name: object) -> str | None:
    """Why ``name`` is not an IANA time zone, or None."""
    if not isinstance(name, str) or not name:
        return "must be an IANA time zone such as America/New_York"
    if name not in _zones():
        return f"{name!r} is not an IANA time zone (e.g. America/New_York, Europe/Berlin, UTC)"
    return None


def _zones() -> set[str]:
    global _ZONES
    if _ZONES is None:
        _ZONES = available_timezones() | {"UTC"}
    return _ZONES


_ZONES: set[str] | None = None


@dataclass(frozen=True)
class Window:
    """A weekly window: ``days`` (0 Monday .. 6 Sunday, the days it starts on), ``start`` and
    ``end`` on the wall clock of ``zone``."""

    days: frozenset[int]
    start: time
    end: time
    zone: str

    def occurrences(self, since: datetime, until: datetime) -> list[tuple[datetime, datetime]]:
        """The window's intervals ``[start, end)`` (UTC) that overlap ``[since, until)``, in
        order. An interval the clock skips entirely (inside a spring-forward gap) is left out."""
        zone = ZoneInfo(self.zone)
        first = since.astimezone(zone).date() - timedelta(days=1)
        last = until.astimezone(zone).date()
        found = []
        day = first
        while day <= last:
            if day.weekday() in self.days:
                opens = wall_instant(day, self.start, zone)
                ends_on = day + timedelta(days=1) if self.end <= self.start else day
                closes = wall_instant(ends_on, self.end, zone)
                if opens < closes and opens < until and closes > since:
                    found.append((opens, closes))
            day += timedelta(days=1)
        return found

    def active_at(self, at: datetime) -> bool:
        return bool(self.occurrences(at, at + timedelta(microseconds=1)))

    def describe(self) -> str:
        """``Mon-Fri 08:00-20:00 America/New_York``."""
        return f"{describe_days(self.days)} {_clock(self.start)}-{_clock(self.end)} {self.zone}"


def wall_instant(day: date, clock: time, zone: ZoneInfo) -> datetime:
    """The UTC instant at which the wall clock of ``zone`` first shows ``clock`` on ``day``
    (for a time the clock skips: the instant of the jump)."""
    local = datetime.combine(day, clock, tzinfo=zone)  # fold 0: the first of two showings
    instant = local.astimezone(UTC)
    if _wall(instant, zone) == local.replace(tzinfo=None):
        return instant
    # Skipped: fold 0 reads the time with the offset before the jump, fold 1 with the one
    # after, and the jump lies between the two readings. Find the first second whose wall
    # time is at or past the one asked for (zones jump on whole seconds).
    target = local.replace(tzinfo=None)
    low, high = sorted((int(local.replace(fold=1).timestamp()), int(instant.timestamp())))
    while high - low > 1:
        middle = (low + high) // 2
        if _wall(datetime.fromtimestamp(middle, UTC), zone) >= target:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None, fold=0)


def describe_days(days: Iterable[int]) -> str:
    """``Mon-Fri``, ``Sat, Sun``, ``Fri-Mon``, ``every day``: runs of three or more days as a
    range. The week wraps, as the written form's ``fri-mon`` does: a run ending on Sunday goes
    on into Monday."""
    ordered = sorted(set(days))
    if len(ordered) == 7:
        return "every day"
    runs: list[list[int]] = []
    for day in ordered:
        if runs and runs[-1][-1] == day - 1:
            runs[-1].append(day)
        else:
            runs.append([day])
    if len(runs) > 1 and runs[0][0] == 0 and runs[-1][-1] == 6:
        runs.insert(0, runs.pop() + runs.pop(0))
    parts = []
    for run in runs:
        names = [DAY_NAMES[day].title() for day in run]
        parts.append(f"{names[0]}-{names[-1]}" if len(run) >= 3 else ", ".join(names))
    return ", ".join(parts)


def _clock(moment: time) -> str:
    return moment.strftime("%H:%M:%S" if moment.second else "%H:%M")


@dataclass(frozen=True)
class Change:
    """One value a schedule entry or an override sets: ``setting`` of ``target`` (a pool's
    name for a floor, a deployment's for a replica bound, "" for the rank order) to ``value``
    (a count, or for the rank order the pools' names, highest priority first)."""

    setting: str
    target: str
    value: int | tuple[str, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.setting, self.target)

    def describe(self) -> str:
        if self.setting == RANK_ORDER:
            return "rank order " + " > ".join(self.value)  # type: ignore[arg-type]
        owner = "pool" if self.setting == FLOOR_GPUS else "deployment"
        return f"{owner} {self.target} {self.setting} {self.value}"


@dataclass(frozen=True)
class Entry:
    """A named schedule entry: its window and what it sets while the window is open."""

    name: str
    window: Window
    changes: tuple[Change, ...]


@dataclass(frozen=True)
class Override:
    """A temporary override set from outside (an external calendar, a capacity controller):
    what it sets from ``starts_at`` until ``expires_at``, and who set it."""

    name: str
    changes: tuple[Change, ...]
    expires_at: datetime
    starts_at: datetime | None = None
    set_by: str = ""

    def active_at(self, at: datetime) -> bool:
        return (self.starts_at is None or self.starts_at <= at) and at < self.expires_at


@dataclass(frozen=True)
class Conflict:
    """Two entries that set the same value while both are open, first at ``at``; ``values``:
    what each sets it to."""

    first: str
    second: str
    key: tuple[str, str]
    at: datetime
    values: tuple[int | tuple[str, ...], int | tuple[str, ...]] | None = None

    def describe(self, zone: str = "UTC") -> str:
        setting, target = self.key
        what = (
            "the rank order"
            if setting == RANK_ORDER
            else f"{'pool' if setting == FLOOR_GPUS else 'deployment'} {target}'s {setting}"
        )
        when = self.at.astimezone(ZoneInfo(zone)).strftime("%a %Y-%m-%d %H:%M")
        words = (
            f'entries "{self.first}" and "{self.second}" both set {what} while both are open '
            f"(first at {when} {zone})"
        )
        if self.values is not None:
            first, second = (_value_words(value) for value in self.values)
            words += f': "{self.first}" sets it to {first}, "{self.second}" to {second}'
        return words


def _value_words(value: int | tuple[str, ...]) -> str:
    return " > ".join(value) if isinstance(value, tuple) else str(value)


def conflicts(entries: Sequence[Entry], since: datetime) -> list[Conflict]:
    """Pairs of entries that set the same value and are open at the same instant within
    `CONFLICT_HORIZON` of ``since``, each with the first such instant."""
    until = since + CONFLICT_HORIZON
    found = []
    intervals: dict[str, list[tuple[datetime, datetime]]] = {}
    for index, first in enumerate(entries):
        for second in entries[index + 1 :]:
            shared = {change.key for change in first.changes} & {
                change.key for change in second.changes
            }
            if not shared:
                continue
            for entry in (first, second):
                if entry.name not in intervals:
                    intervals[entry.name] = entry.window.occurrences(since, until)
            overlap = _first_overlap(intervals[first.name], intervals[second.name])
            if overlap is not None:
                sets = [{change.key: change.value for change in e.changes} for e in (first, second)]
                for key in sorted(shared):
                    values = (sets[0][key], sets[1][key])
                    found.append(Conflict(first.name, second.name, key, overlap, values))
    return found


def windows_overlap(first: Window, second: Window, since: datetime) -> datetime | None:
    """The first instant within `CONFLICT_HORIZON` of ``since`` at which both windows are
    open, or None (what two tenants' reservations, or one tenant's two, are checked by)."""
    until = since + CONFLICT_HORIZON
    return _first_overlap(first.occurrences(since, until), second.occurrences(since, until))


def _first_overlap(
    left: list[tuple[datetime, datetime]], right: list[tuple[datetime, datetime]]
) -> datetime | None:
    i = j = 0
    while i < len(left) and j < len(right):
        start = max(left[i][0], right[j][0])
        if start < min(left[i][1], right[j][1]):
            return start
        if left[i][1] <= right[j][1]:
            i += 1
        else:
            j += 1
    return None


@dataclass(frozen=True)
class Base:
    """A set's own values: per pool (rank, floor_gpus), per deployment (min, max replicas)."""

    pools: Mapping[str, tuple[int, int]]
    deployments: Mapping[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Policy:
    """The values in force at one instant, and where each changed one comes from."""

    at: datetime
    ranks: Mapping[str, int]
    floors: Mapping[str, int]
    replicas: Mapping[str, tuple[int, int]]  # deployment -> (min, max)
    # (setting, target) -> 'entry "day-shift"' or 'override "peak" (set by capacity-bot)'
    sources: Mapping[tuple[str, str], str]

    def differences(self, other: Policy) -> list[str]:
        """What changes from this policy to ``other``, in words, one line per value."""
        lines = []
        for pool in sorted(self.floors):
            if other.floors.get(pool) != self.floors[pool]:
                lines.append(f"pool {pool} floor {self.floors[pool]} → {other.floors[pool]} GPUs")
        old_order = sorted(self.ranks, key=self.ranks.__getitem__)
        new_order = sorted(other.ranks, key=other.ranks.__getitem__)
        if old_order != new_order:
            lines.append(f"rank order {' > '.join(old_order)} → {' > '.join(new_order)}")
        for name in sorted(self.replicas):
            if other.replicas.get(name) != self.replicas[name]:
                (old_min, old_max), (new_min, new_max) = self.replicas[name], other.replicas[name]
                lines.append(
                    f"deployment {name} replicas {old_min}-{old_max} → {new_min}-{new_max}"
                )
        return lines


def effective(
    base: Base, entries: Iterable[Entry], overrides: Iterable[Override], at: datetime
) -> Policy:
    """The policy in force at ``at``: each value from the active override that sets it, else
    from the active entry that sets it (entries that would both are refused when written;
    should two meet anyway, the first by name wins), else the set's own. A rank order ranks
    the pools it names, in its order, on the ranks those pools hold themselves: the other pools
    keep theirs, and ranks stay unique. A change naming a pool or deployment the set no
    longer has is ignored (a rank order left with fewer than two of its pools, whole). A
    deployment's maximum is never below its minimum in force."""
    chosen: dict[tuple[str, str], tuple[Change, str]] = {}
    for entry in sorted(entries, key=lambda entry: entry.name):
        if entry.window.active_at(at):
            for change in entry.changes:
                chosen.setdefault(change.key, (change, f'entry "{entry.name}"'))
    for override in sorted(overrides, key=lambda override: override.name):
        if override.active_at(at):
            by = f" (set by {override.set_by})" if override.set_by else ""
            for change in override.changes:
                source = f'override "{override.name}"{by}'
                if change.key not in chosen or chosen[change.key][1].startswith("entry "):
                    chosen[change.key] = (change, source)
    ranks = {pool: rank for pool, (rank, _) in base.pools.items()}
    floors = {pool: floor for pool, (_, floor) in base.pools.items()}
    replicas = dict(base.deployments)
    sources = {}
    for key, (change, source) in chosen.items():
        setting, target = key
        if setting == FLOOR_GPUS and target in floors:
            floors[target] = int(change.value)  # type: ignore[arg-type]
        elif setting in (MIN_REPLICAS, MAX_REPLICAS) and target in replicas:
            low, high = replicas[target]
            value = int(change.value)  # type: ignore[arg-type]
            replicas[target] = (value, high) if setting == MIN_REPLICAS else (low, value)
        elif setting == RANK_ORDER and len(named := _known(change.value, ranks)) >= 2:
            slots = sorted(base.pools[pool][0] for pool in named)
            ranks.update(zip(named, slots, strict=True))
        else:
            continue
        sources[key] = source
    # A raised minimum lifts a maximum below it, as a deployment's range in force does
    # (`InferenceDeployment.max_replicas_in_force`): an entry may set only the minimum.
    replicas = {name: (low, max(low, high)) for name, (low, high) in replicas.items()}
    return Policy(at=at, ranks=ranks, floors=floors, replicas=replicas, sources=sources)


def _known(order: object, ranks: Mapping[str, int]) -> list[str]:
    """The pools of a rank order the set still has (fewer than two: nothing to reorder)."""
    return [pool for pool in order if pool in ranks]  # type: ignore[union-attr]


def boundaries(
    entries: Iterable[Entry], overrides: Iterable[Override], since: datetime, until: datetime
) -> list[datetime]:
    """Every instant in ``(since, until]`` at which an entry opens or closes or an override
    starts or expires, in order, each once. An entry that closes and opens again at once (a
    whole-day window on two days running) is open throughout: that is no boundary."""
    found: set[datetime] = set()
    for entry in entries:
        occurrences = entry.window.occurrences(since, until + timedelta(microseconds=1))
        opening = {opens for opens, _ in occurrences}
        closing = {closes for _, closes in occurrences}
        found.update(moment for moment in opening ^ closing if since < moment <= until)
    for override in overrides:
        for moment in (override.starts_at, override.expires_at):
            if moment is not None and since < moment <= until:
                found.add(moment)
    return sorted(found)

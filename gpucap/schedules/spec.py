"""Reading what an operator or a client wrote for a schedule entry or an override: one reader
for the API, the fleet file and the set page's form, so each says the same thing about the
same mistake.

The written form (JSON or YAML)::

    name: day-shift
    days: [mon, tue, wed, thu, fri]        # or "mon-fri", "every day", 0 (Monday) .. 6
    start: "08:00"
    end: "20:00"                           # at or before start: ends the next day
    time_zone: America/New_York
    pools: {chat: {floor_gpus: 64}}
    rank_order: [chat, research]           # these pools swap places among their own ranks
    deployments: {llama: {min_replicas: 8, max_replicas: 16}}

Problems are collected as ``{field: reason}`` with dotted field names
(``pools.chat.floor_gpus``), the shape of the API's errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

from gpucap.fleet.models import Pool
from gpucap.inference.models import MAX_REPLICAS, InferenceDeployment
from gpucap.schedules import calendar

WINDOW_FIELDS = ("days", "start", "end", "time_zone")
CHANGE_FIELDS = ("pools", "rank_order", "deployments")
POOL_SETTINGS = (calendar.FLOOR_GPUS,)
DEPLOYMENT_SETTINGS = (calendar.MIN_REPLICAS, calendar.MAX_REPLICAS)
_CLOCK = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$")
NAME_RULE = "must be 1-64 lowercase letters, digits and hyphens, not starting or ending with one"
# The longest an override may last: a client that forgets one must not change policy for good.
MAX_OVERRIDE_SECONDS = 31 * 24 * 3600
_CALENDAR_MARGIN = timedelta(days=366)
_CALENDAR_END = datetime(9999, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class ChangeSpec:
    """One change, resolved: the setting, its pool or deployment, the value or position."""

    setting: str
    pool: Pool | None = None
    deployment: InferenceDeployment | None = None
    value: int | None = None
    position: int | None = None


def name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not _NAME.match(name):
        return NAME_RULE
    return None


def read_window(data: Mapping, problems: dict[str, str]) -> calendar.Window | None:
    """The weekly window of ``data``, or None with its problems added."""
    days = read_days(data.get("days"), problems)
    start = read_clock(data.get("start"), "start", problems)
    end = read_clock(data.get("end"), "end", problems)
    zone = data.get("time_zone")
    if problem := calendar.zone_problem(zone):
        problems["time_zone"] = problem
    if days is None or start is None or end is None or "time_zone" in problems:
        return None
    return calendar.Window(days=frozenset(days), start=start, end=end, zone=zone)


def read_days(value: object, problems: dict[str, str]) -> list[int] | None:
    """``[mon, tue]``, ``"mon-fri"``, ``"sat, sun"``, ``"every day"`` or ``[0, 1]``; a day by
    its three letters or its whole name (``monday-friday``); a range may wrap (``fri-mon``)."""
    rule = (
        "must name the days the window starts on: a list such as [mon, tue] or [0, 1] "
        '(0 is Monday), or text such as "mon-fri" or "every day"'
    )
    if isinstance(value, str):
        words = value.strip().lower()
        if words in ("every day", "daily", "all"):
            return list(range(7))
        items: list = []
        for part in (part.strip() for part in words.split(",")):
            first, dash, last = part.partition("-")
            low, high = _day(first), _day(last)
            if dash and low is not None and high is not None:
                items.extend((low + step) % 7 for step in range((high - low) % 7 + 1))
            else:
                items.append(part)
        value = items
    if not isinstance(value, list) or not value:
        problems["days"] = rule
        return None
    days = []
    for item in value:
        if isinstance(item, bool):
            day = None
        elif isinstance(item, int):
            day = item if 0 <= item <= 6 else None
        else:
            day = _day(item) if isinstance(item, str) else None
        if day is None:
            problems["days"] = f"{item!r} is not a day: {rule}"
            return None
        days.append(day)
    return sorted(set(days))


def _day(word: str) -> int | None:
    """0 (Monday) .. 6 for ``mon`` or ``monday`` in any case, else None."""
    return _DAYS.get(word.strip().lower())


_DAYS = {name: day for day, name in enumerate(calendar.DAY_NAMES)} | {
    name: day
    for day, name in enumerate(
        ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
    )
}


def read_clock(value: object, field: str, problems: dict[str, str]) -> time | None:
    if isinstance(value, time):
        return value
    match = _CLOCK.match(value) if isinstance(value, str) else None
    if match is None:
        problems[field] = f'must be a time of day as HH:MM (24-hour, e.g. "08:00"), got {value!r}'
        if isinstance(value, int) and not isinstance(value, bool):
            # YAML 1.1 reads an unquoted 20:00 as the number 1200 (base 60).
            problems[field] += '; in YAML, quote the time ("20:00")'
        return None
    hours, minutes, seconds = match.groups()
    return time(int(hours), int(minutes), int(seconds or 0))


def read_changes(
    data: Mapping,
    *,
    pools: Mapping[str, Pool],
    deployments: Mapping[str, InferenceDeployment],
    set_gpus: int,
    problems: dict[str, str],
) -> list[ChangeSpec]:
    """What ``data`` sets, resolved against the set's ``pools`` and ``deployments`` (by
    name and slug). At least one change is required."""
    changes: list[ChangeSpec] = []
    for name, settings in _mapping(data.get("pools"), "pools", problems).items():
        pool = pools.get(name)
        if pool is None:
            problems[f"pools.{name}"] = "is not a pool of this capacity set"
            continue
        for setting, value in _settings(settings, f"pools.{name}", POOL_SETTINGS, problems):
            if _count(value, f"pools.{name}.{setting}", set_gpus, problems):
                changes.append(ChangeSpec(setting=setting, pool=pool, value=value))
    for slug, settings in _mapping(data.get("deployments"), "deployments", problems).items():
        deployment = deployments.get(slug)
        if deployment is None:
            problems[f"deployments.{slug}"] = "is not an inference deployment of this capacity set"
            continue
        bounds = {}
        for setting, value in _settings(
            settings, f"deployments.{slug}", DEPLOYMENT_SETTINGS, problems
        ):
            if _count(value, f"deployments.{slug}.{setting}", MAX_REPLICAS, problems):
                bounds[setting] = value
                changes.append(ChangeSpec(setting=setting, deployment=deployment, value=value))
        low, high = bounds.get(calendar.MIN_REPLICAS), bounds.get(calendar.MAX_REPLICAS)
        if low is not None and high is not None and low > high:
            problems[f"deployments.{slug}.min_replicas"] = (
                f"min_replicas {low} is above max_replicas {high}"
            )
    order = data.get("rank_order")
    if order is not None:
        changes.extend(_rank_order(order, pools, problems))
    if not changes and not problems:
        problems["non_field_errors"] = (
            "sets nothing: give pools (floor_gpus), rank_order or deployments "
            "(min_replicas, max_replicas)"
        )
    return changes


def _rank_order(
    order: object, pools: Mapping[str, Pool], problems: dict[str, str]
) -> list[ChangeSpec]:
    if (
        not isinstance(order, list)
        or len(order) < 2
        or not all(isinstance(name, str) for name in order)
    ):
        problems["rank_order"] = "must list two or more of the set's pools, highest priority first"
        return []
    if len(set(order)) != len(order):
        problems["rank_order"] = "names a pool twice"
        return []
    strangers = [name for name in order if name not in pools]
    if strangers:
        problems["rank_order"] = f"{', '.join(strangers)}: not pools of this capacity set"
        return []
    return [
        ChangeSpec(setting=calendar.RANK_ORDER, pool=pools[name], position=position)
        for position, name in enumerate(order, start=1)
    ]


def _mapping(value: object, field: str, problems: dict[str, str]) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems[field] = "must be a mapping of names to settings"
        return {}
    return value


def _settings(value: object, field: str, allowed: tuple[str, ...], problems: dict[str, str]):
    if not isinstance(value, Mapping) or not value:
        problems[field] = f"must set one or more of {', '.join(allowed)}"
        return []
    found = []
    for setting, amount in value.items():
        if setting not in allowed:
            problems[f"{field}.{setting}"] = f"cannot be scheduled; settings: {', '.join(allowed)}"
        else:
            found.append((setting, amount))
    return found


def _count(value: object, field: str, most: int, problems: dict[str, str]) -> bool:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        problems[field] = f"must be a whole number from 0 to {most}, got {value!r}"
        return False
    return True


def read_override_times(
    data: Mapping, now: datetime, problems: dict[str, str]
) -> tuple[datetime | None, datetime]:
    """An override's ``starts_at`` and ``expires_at`` (given, or ``ttl_seconds`` from its start
    or ``now``), each problem named by its field."""
    starts_at = _moment(data.get("starts_at"), "starts_at", problems)
    expires_at = _moment(data.get("expires_at"), "expires_at", problems)
    ttl = data.get("ttl_seconds")
    if ttl is not None:
        if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 < ttl <= MAX_OVERRIDE_SECONDS:
            problems["ttl_seconds"] = (
                f"must be a whole number of seconds from 1 to {MAX_OVERRIDE_SECONDS}"
            )
        elif expires_at is not None:
            problems["ttl_seconds"] = "give expires_at or ttl_seconds, not both"
        else:
            expires_at = (starts_at or now) + timedelta(seconds=ttl)
    if expires_at is None and not {"expires_at", "ttl_seconds"} & problems.keys():
        problems["expires_at"] = "an override must expire: give expires_at or ttl_seconds"
    if expires_at is not None and "expires_at" not in problems:
        if expires_at <= max(now, starts_at or now):
            problems["expires_at"] = "must be in the future, after starts_at"
        elif expires_at - (starts_at or now) > timedelta(seconds=MAX_OVERRIDE_SECONDS):
            problems["expires_at"] = "an override may last at most 31 days"
    return starts_at, expires_at or now


def _moment(value: object, field: str, problems: dict[str, str]) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            moment = None
        if moment is not None and moment.tzinfo is not None:
            # The calendar reads on from a moment (a TTL, the days after): year 9999 has no after.
            if datetime.min.replace(tzinfo=UTC) + _CALENDAR_MARGIN < moment < _CALENDAR_END:
                return moment
            problems[field] = "must be a time between the years 0002 and 9998"
            return None
    problems[field] = 'must be an ISO 8601 time with a time zone (e.g. "2026-12-01T20:00:00Z")'
    return None


def as_calendar_changes(specs: list[ChangeSpec]) -> tuple[calendar.Change, ...]:
    """The changes as the calendar reads them (a rank order as one change)."""
    changes = []
    order = sorted(
        (spec for spec in specs if spec.setting == calendar.RANK_ORDER),
        key=lambda spec: spec.position,
    )
    for spec in specs:
        if spec.setting == calendar.FLOOR_GPUS:
            changes.append(calendar.Change(spec.setting, spec.pool.name, spec.value))
        elif spec.setting != calendar.RANK_ORDER:
            changes.append(calendar.Change(spec.setting, spec.deployment.slug, spec.value))
    if order:
        names = tuple(spec.pool.name for spec in order)
        changes.append(calendar.Change(calendar.RANK_ORDER, "", names))
    return tuple(changes)


def written(changes: list[calendar.Change]) -> dict:
    """Changes back in their written form (the API's and the fleet file's)."""
    out: dict = {}
    for change in changes:
        if change.setting == calendar.FLOOR_GPUS:
            out.setdefault("pools", {}).setdefault(change.target, {})[change.setting] = change.value
        elif change.setting == calendar.RANK_ORDER:
            out["rank_order"] = list(change.value)
        else:
            deployments = out.setdefault("deployments", {})
            deployments.setdefault(change.target, {})[change.setting] = change.value
    return out

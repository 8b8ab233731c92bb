"""The edited configuration a simulation run compares with today's policy (issue 21).

Its JSON form::

    {"pools": {"h100-spot": {"rank": 3, "floor_gpus": 0}},
     "deployments": {"acme-chat": {"min_replicas": 1, "max_replicas": 4}},
     "schedule": null}

``schedule`` is null or absent to keep the set's entries, ``[]`` for none, or a list of entries
in the form the schedule API takes (``name``, ``days``, ``start``, ``end``, ``time_zone``,
``pools``, ``rank_order``, ``deployments``), read by the same reader
(`gpucap.schedules.spec`). The set's overrides stay either way: they are set from outside and
would be in force whatever the schedule. `changes_apply` reads the changes against a start and
gives the edited start, or raises `ChangesError` with every problem by field
(``changes.pools.h100-spot.floor_gpus``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from gpucap.inference.models import MAX_REPLICAS
from gpucap.plans.simulation import SimulationStart
from gpucap.schedules import calendar, spec

SECTIONS = ("pools", "deployments", "schedule")
POOL_FIELDS = ("rank", "floor_gpus")
DEPLOYMENT_FIELDS = ("min_replicas", "max_replicas")
MAX_ENTRIES = 50


class ChangesError(ValueError):
    """Changes that cannot be applied: ``problems`` maps each field to why."""

    def __init__(self, problems: Mapping[str, str]) -> None:
        self.problems = dict(problems)
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.problems.items()))


@dataclass(frozen=True)
class _Named:
    """A pool or deployment of the start, by the name the schedule reader looks up."""

    name: str
    slug: str


def changes_apply(start: SimulationStart, changes: object) -> SimulationStart:
    """``start`` with ``changes`` applied."""
    problems: dict[str, str] = {}
    if not isinstance(changes, Mapping):
        raise ChangesError({"changes": "must be an object of pools, deployments and schedule"})
    for key in changes:
        if key not in SECTIONS:
            problems[f"changes.{key}"] = f"is not a part of the changes: {', '.join(SECTIONS)}"
    snapshot = start.snapshot
    pools = {pool.name: pool for pool in snapshot.pools}
    set_gpus = sum(node.gpus for node in snapshot.nodes)
    pool_values = _section(changes.get("pools"), "pools", pools, POOL_FIELDS, problems)
    for name, values in pool_values.items():
        for field, value in values.items():
            most = set_gpus if field == "floor_gpus" else 10_000
            _whole(
                value, f"changes.pools.{name}.{field}", 1 if field == "rank" else 0, most, problems
            )
    deployment_values = _section(
        changes.get("deployments"), "deployments", start.deployments, DEPLOYMENT_FIELDS, problems
    )
    for slug, values in deployment_values.items():
        for field, value in values.items():
            _whole(value, f"changes.deployments.{slug}.{field}", 0, MAX_REPLICAS, problems)
    entries = _schedule(changes.get("schedule"), start, problems)
    if problems:
        raise ChangesError(problems)
    edited_pools = tuple(
        dataclasses.replace(pool, **pool_values.get(pool.name, {})) for pool in snapshot.pools
    )
    _ranks_unique(edited_pools, pool_values, problems)
    if sum(pool.floor_gpus for pool in edited_pools) > set_gpus:
        problems["changes.pools"] = (
            f"floors would add up to {sum(p.floor_gpus for p in edited_pools)} GPUs; the set "
            f"has {set_gpus}"
        )
    deployments = {
        slug: dataclasses.replace(spec_, **deployment_values.get(slug, {}))
        for slug, spec_ in start.deployments.items()
    }
    for slug, spec_ in deployments.items():
        if slug in deployment_values and spec_.min_replicas > spec_.max_replicas:
            problems[f"changes.deployments.{slug}.min_replicas"] = (
                f"min_replicas {spec_.min_replicas} is above max_replicas {spec_.max_replicas}"
            )
    if problems:
        raise ChangesError(problems)
    return dataclasses.replace(
        start,
        snapshot=dataclasses.replace(snapshot, pools=edited_pools),
        deployments=deployments,
        entries=start.entries if entries is None else entries,
    )


def _section(
    value: object,
    section: str,
    known: Mapping,
    fields: tuple[str, ...],
    problems: dict[str, str],
) -> dict[str, dict]:
    if value is None:
        return {}
    where = f"changes.{section}"
    if not isinstance(value, Mapping):
        problems[where] = "must be an object by name"
        return {}
    found: dict[str, dict] = {}
    what = "pool" if section == "pools" else "inference deployment"
    for name, settings in value.items():
        if name not in known:
            problems[f"{where}.{name}"] = f"is not a {what} of this capacity set"
            continue
        if not isinstance(settings, Mapping) or not settings:
            problems[f"{where}.{name}"] = f"must set one or more of {', '.join(fields)}"
            continue
        for field in settings:
            if field not in fields:
                problems[f"{where}.{name}.{field}"] = (
                    f"cannot be changed here; fields: {', '.join(fields)}"
                )
        found[name] = {field: settings[field] for field in fields if field in settings}
    return found


def _whole(value: object, where: str, least: int, most: int, problems: dict[str, str]) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        problems[where] = f"must be a whole number from {least} to {most}, got {value!r}"


def _ranks_unique(pools, pool_values: Mapping, problems: dict[str, str]) -> None:
    by_rank: dict[int, str] = {}
    for pool in sorted(pools, key=lambda p: p.name not in pool_values):
        if pool.rank in by_rank:
            changed = pool.name if pool.name in pool_values else by_rank[pool.rank]
            other = by_rank[pool.rank] if changed == pool.name else pool.name
            problems[f"changes.pools.{changed}.rank"] = (
                f"rank {pool.rank} is also the rank of pool {other}; ranks are unique within a "
                "set (change both)"
            )
        by_rank.setdefault(pool.rank, pool.name)


def _schedule(
    value: object, start: SimulationStart, problems: dict[str, str]
) -> tuple[calendar.Entry, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_ENTRIES:
        problems["changes.schedule"] = (
            f"must be null (the set's), [] (none) or a list of up to {MAX_ENTRIES} entries"
        )
        return None
    pools = {pool.name: _Named(pool.name, pool.name) for pool in start.snapshot.pools}
    deployments = {slug: _Named(slug, slug) for slug in start.deployments}
    set_gpus = sum(node.gpus for node in start.snapshot.nodes)
    entries: list[calendar.Entry] = []
    names: set[str] = set()
    for index, data in enumerate(value):
        where = f"changes.schedule[{index}]"
        if not isinstance(data, Mapping):
            problems[where] = "must be a schedule entry (an object)"
            continue
        found: dict[str, str] = {}
        name = data.get("name")
        if problem := spec.name_problem(name):
            found["name"] = problem
        elif name in names:
            found["name"] = f"{name!r} names another entry too"
        for key in data:
            if key not in ("name", *spec.WINDOW_FIELDS, *spec.CHANGE_FIELDS):
                found[key] = "is not a field of a schedule entry"
        window = spec.read_window(data, found)
        read = spec.read_changes(
            data, pools=pools, deployments=deployments, set_gpus=set_gpus, problems=found
        )
        problems.update({f"{where}.{field}": reason for field, reason in found.items()})
        if not found:
            names.add(name)
            entries.append(
                calendar.Entry(name=name, window=window, changes=spec.as_calendar_changes(read))
            )
    if not problems and entries:
        clashes = calendar.conflicts(entries, start.snapshot.now)
        if clashes:
            problems["changes.schedule"] = "; ".join(clash.describe() for clash in clashes)
    return tuple(entries)

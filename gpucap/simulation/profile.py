"""The load a simulation replays: requests per second per inference deployment, and VM requests
per spot or on-demand pool, over simulated time.

A curve is a list of points ``[seconds_from_start, rate]``, times strictly increasing from 0 or
later. Its ``shape`` says what happens between points:

- ``linear`` (the default): the rate moves in a straight line from one point to the next;
- ``step``: each point's rate holds until the next point.

Before the first point the curve holds the first point's rate, after the last one the last
point's rate. The JSON form::

    {"deployments": {"chat": {"points": [[0, 40], [32400, 80]], "shape": "step",
                              "service_seconds": 0.5}},
     "pools": {"spot": {"points": [[0, 6]], "gpus_per_vm": 8, "duration_seconds": 7200,
                        "tenant": "acme"}}}

A top-level ``"notes"`` (a list of sentences, as a profile recorded from the router's counters
carries: gpucap/inference/load_profile.py) is accepted and ignored.

A deployment's rate is requests per second, each served in ``service_seconds`` by one of a
replica's ``replica_concurrency`` slots. A pool's rate is VMs asked for per hour, each of
``gpus_per_vm`` GPUs, ending ``duration_seconds`` after it starts running.

The shape of each key is declared once (pydantic); every problem is reported with the field it
is in, ``{"deployments.chat.points[3]": "time 120 is not after the point before it (300)"}``,
the shape of the API's errors. `curve_from_csv` reads one curve from CSV text.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SHAPES = ("linear", "step")
MAX_GPUS_PER_VM = 8

_Rate = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Point = Annotated[list[_Rate], Field(min_length=2, max_length=2)]


@dataclass(frozen=True)
class Curve:
    """A rate over simulated time: points ``(seconds_from_start, rate)``, times increasing."""

    points: tuple[tuple[float, float], ...]
    shape: str = "linear"

    def at(self, seconds: float) -> float:
        """The rate ``seconds`` after the start."""
        points = self.points
        after = bisect.bisect_right(points, (seconds, math.inf))
        if after == 0:
            return points[0][1]
        if after == len(points) or self.shape == "step":
            return points[after - 1][1]
        (t0, r0), (t1, r1) = points[after - 1], points[after]
        return r0 + (r1 - r0) * (seconds - t0) / (t1 - t0)

    def to_dict(self) -> dict:
        return {"shape": self.shape, "points": [list(point) for point in self.points]}


@dataclass(frozen=True)
class DeploymentLoad:
    """An inference deployment's requests per second and how long one request takes."""

    requests: Curve
    service_seconds: float


@dataclass(frozen=True)
class VmArrivals:
    """A pool's VM requests: VMs per hour, their size and how long each runs."""

    vms_per_hour: Curve
    gpus_per_vm: int
    duration_seconds: float
    tenant: str | None = None


@dataclass(frozen=True)
class Profile:
    """The load of one simulation, per deployment (by slug) and per pool (by name)."""

    deployments: Mapping[str, DeploymentLoad] = field(default_factory=dict)
    pools: Mapping[str, VmArrivals] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON form `profile_from_dict` reads back."""
        return {
            "deployments": {
                slug: {**load.requests.to_dict(), "service_seconds": load.service_seconds}
                for slug, load in self.deployments.items()
            },
            "pools": {
                name: {
                    **arrivals.vms_per_hour.to_dict(),
                    "gpus_per_vm": arrivals.gpus_per_vm,
                    "duration_seconds": arrivals.duration_seconds,
                    **({"tenant": arrivals.tenant} if arrivals.tenant is not None else {}),
                }
                for name, arrivals in self.pools.items()
            },
        }


class ProfileError(ValueError):
    """A profile that cannot be read: ``problems`` maps each bad field to why."""

    def __init__(self, problems: Mapping[str, str]) -> None:
        self.problems = dict(problems)
        super().__init__("; ".join(f"{where}: {why}" for where, why in self.problems.items()))


# --- the declared shape -------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _DeploymentIn(_Strict):
    shape: Literal["linear", "step"] = "linear"
    points: list[_Point] = Field(min_length=1)
    service_seconds: float = Field(gt=0, allow_inf_nan=False)


class _PoolIn(_Strict):
    shape: Literal["linear", "step"] = "linear"
    points: list[_Point] = Field(min_length=1)
    gpus_per_vm: int = Field(ge=1, le=MAX_GPUS_PER_VM)
    duration_seconds: float = Field(gt=0, allow_inf_nan=False)
    tenant: str | None = None


class _ProfileIn(_Strict):
    deployments: dict[str, _DeploymentIn] = {}
    pools: dict[str, _PoolIn] = {}
    notes: list[str] = []  # what a recorded profile says about itself; the simulation ignores it


# --- readers ------------------------------------------------------------------------------------


def profile_from_json(text: str | bytes) -> Profile:
    """Read a profile's JSON text; raises `ProfileError` naming every bad field."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as error:
        raise ProfileError({"profile": f"is not valid JSON: {error}"}) from None
    return profile_from_dict(data)


def profile_from_dict(data: object) -> Profile:
    """Read a parsed profile (an API body); raises `ProfileError` naming every bad field."""
    if not isinstance(data, dict):
        raise ProfileError({"profile": f"must be an object, got {_shown(data)}"})
    try:
        read = _ProfileIn.model_validate(data)
    except ValidationError as error:
        raise ProfileError(_problems(error)) from None
    problems: dict[str, str] = {}
    for section, items in (("deployments", read.deployments), ("pools", read.pools)):
        for name, item in items.items():
            _check_times(item.points, f"{section}.{name}.points", problems)
    if problems:
        raise ProfileError(problems)
    return Profile(
        deployments={
            slug: DeploymentLoad(
                requests=_curve(item.points, item.shape),
                service_seconds=item.service_seconds,
            )
            for slug, item in read.deployments.items()
        },
        pools={
            name: VmArrivals(
                vms_per_hour=_curve(item.points, item.shape),
                gpus_per_vm=item.gpus_per_vm,
                duration_seconds=item.duration_seconds,
                tenant=item.tenant,
            )
            for name, item in read.pools.items()
        },
    )


def curve_from_csv(text: str, *, shape: str = "linear", where: str = "points") -> Curve:
    """One curve from CSV rows ``seconds_from_start,rate`` (a first row of words is a header).
    Problems name the row as ``<where>[n]`` (n counts data rows from 0)."""
    if shape not in SHAPES:
        raise ProfileError({"shape": f"must be one of {', '.join(SHAPES)}; got {shape!r}"})
    rows = [row for row in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in row)]
    if rows and not _is_number(rows[0][0]):
        rows = rows[1:]
    problems: dict[str, str] = {}
    points: list[tuple[float, float]] = []
    for index, row in enumerate(rows):
        label = f"{where}[{index}]"
        if len(row) != 2:
            problems[label] = f"must be two columns, seconds_from_start,rate; got {len(row)}"
            continue
        values = []
        for name, cell in zip(("time", "rate"), row, strict=True):
            value = _number(cell)
            if value is None or value < 0:
                problems[label] = f"{name} must be a number, 0 or more; got {cell.strip()!r}"
                break
            values.append(value)
        else:
            points.append((values[0], values[1]))
    if not rows:
        problems[where] = "must have at least one point"
    if not problems:
        _check_times(points, where, problems)
    if problems:
        raise ProfileError(problems)
    return _curve(points, shape)


def _check_times(points: list[tuple[float, float]], where: str, problems: dict[str, str]) -> None:
    for index in range(1, len(points)):
        if points[index][0] <= points[index - 1][0]:
            problems[f"{where}[{index}]"] = (
                f"time {points[index][0]:g} is not after the point before it "
                f"({points[index - 1][0]:g}): times must increase"
            )
            return


def _number(cell: str) -> float | None:
    try:
        value = float(cell.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _is_number(cell: str) -> bool:
    return _number(cell) is not None


# --- pydantic's findings in words -------------------------------------------------------------


def _problems(error: ValidationError) -> dict[str, str]:
    problems: dict[str, str] = {}
    for found in error.errors():
        where, part = _where(found["loc"])
        reason = _reason(found)
        if found["type"] in ("too_short", "too_long") and isinstance(found["loc"][-1], int):
            reason = "must be a pair [seconds_from_start, rate]"
        problems.setdefault(where, f"{part} {reason}" if part else reason)
    return problems


def _where(loc: tuple) -> tuple[str, str]:
    """``('deployments', 'chat', 'points', 3, 0)`` -> ``('deployments.chat.points[3]', 'time')``."""
    text = ""
    part = ""
    for depth, key in enumerate(loc):
        if isinstance(key, int):
            if (depth >= 1 and loc[depth - 1] == "points") or depth < 2:
                text += f"[{key}]"
            else:
                part = ("time", "rate")[key] if key in (0, 1) else f"[{key}]"
        else:
            text += f".{key}" if text else str(key)
    return text or "profile", part


def _reason(found: dict) -> str:
    kind, value, context = found["type"], found.get("input"), found.get("ctx") or {}
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a field of a profile here"
    if kind == "literal_error":
        return f"must be one of {', '.join(SHAPES)}; got {_shown(value)}"
    if kind == "greater_than_equal":
        return f"must be {context['ge']:g} or more, got {_shown(value)}"
    if kind == "greater_than":
        return f"must be more than {context['gt']:g}, got {_shown(value)}"
    if kind == "less_than_equal":
        return f"must be {context['le']:g} or less, got {_shown(value)}"
    if kind == "finite_number":
        return "must be a finite number"
    if kind in ("float_type", "int_type", "int_from_float"):
        whole = "a whole number" if kind != "float_type" else "a number"
        return f"must be {whole}, got {_shown(value)}"
    if kind == "too_short":
        return "must have at least one point"
    if kind in ("tuple_type", "list_type"):
        return f"must be a list, got {_shown(value)}"
    if kind == "dict_type" or kind == "model_type":
        return f"must be an object, got {_shown(value)}"
    if kind == "string_type":
        return f"must be text, got {_shown(value)}"
    return found["msg"]


def _shown(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _curve(points: list[list[float]], shape: str) -> Curve:
    return Curve(tuple((float(time), float(rate)) for time, rate in points), shape)

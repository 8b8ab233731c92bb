"""What a simulation found: a record per step, the events, the worst moments with the plan the
arbiter made then, the day's figures, and `compare` for two runs side by side."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpucap.arbiter.model import Plan, Snapshot

DAY_SECONDS = 86400


@dataclass(frozen=True)
class DeploymentStep:
    """One deployment during one step: its replicas against its load, and its queue."""

    deployment: str
    rps: float  # requests per second offered
    replicas: int  # live: running (ready or starting) and asked for, as the autoscaler counts
    ready: int  # serving during the step
    desired: int  # what the autoscaler wanted at the step's start
    min_replicas: int  # the range in force
    max_replicas: int
    queue: float  # requests waiting at the end of the step
    wait_p99_seconds: float | None  # None: no replica ready, requests wait unboundedly
    arrived: float
    refused: float
    over_threshold: float


@dataclass(frozen=True)
class PoolStep:
    """One pool during one step: the GPUs its running VMs hold against its floor in force."""

    pool: str
    rank: int
    held_gpus: int
    floor_gpus: int
    pending_gpus: int  # asked for and not running yet


@dataclass(frozen=True)
class Step:
    index: int
    at: datetime
    deployments: tuple[DeploymentStep, ...]
    pools: tuple[PoolStep, ...]
    notices: int  # notices issued at this step
    resumes: int  # reclaimed VMs running again at this step
    planned: bool  # the arbiter planned at this step (something had changed)


@dataclass(frozen=True)
class Event:
    """Something that happened to a VM or the policy: ``notice`` (with the arbiter's reason),
    ``off`` (a notice's deadline passed: the GPUs are free), ``resume``, ``end``, ``policy``,
    ``reservation`` (one came into or went out of force)."""

    at: datetime
    kind: str
    pool: str = ""
    vm: str = ""
    node: str = ""
    tenant: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class PlanMade:
    """A plan the arbiter made during the simulation, and the snapshot it was made from."""

    step: int
    snapshot: Snapshot
    plan: Plan


@dataclass(frozen=True)
class WorstMoment:
    """A step among the worst of its kind (``notices`` or ``wait``), and the arbiter's plan
    then (the latest made at or before it; None if none had been made)."""

    kind: str
    step: int
    at: datetime
    value: float | None  # notices issued, or the p99 wait in seconds (None: unbounded)
    words: str
    made: PlanMade | None


@dataclass(frozen=True)
class Figure:
    """One number of the run: ``key`` for machines, ``label`` for people."""

    key: str
    label: str
    value: float | None
    unit: str = ""

    def shown(self) -> str:
        if self.value is None:
            return "unbounded"
        if self.unit == "s":
            return f"{self.value:.1f} s" if self.value < 100 else f"{self.value:.0f} s"
        if float(self.value).is_integer():
            return f"{self.value:.0f}"
        return f"{self.value:.1f}"


@dataclass(frozen=True)
class Difference:
    label: str
    before: Figure
    after: Figure

    def __str__(self) -> str:
        return f"{self.label} {self.before.shown()} → {self.after.shown()}"


@dataclass(frozen=True)
class SimulationResult:
    start: datetime
    step_seconds: int
    steps: tuple[Step, ...]
    events: tuple[Event, ...]
    worst: tuple[WorstMoment, ...]
    plans_made: int
    plans: tuple[PlanMade, ...]  # every plan, only when asked for (``keep_plans``)

    @property
    def duration_seconds(self) -> int:
        return self.step_seconds * len(self.steps)

    def figures(self) -> list[Figure]:
        """The run's numbers, per day where a count grows with the run's length."""
        per_day = DAY_SECONDS / self.duration_seconds if self.steps else 0.0
        figures: list[Figure] = []
        pools = [pool.pool for pool in self.steps[0].pools] if self.steps else []
        notices = dict.fromkeys(pools, 0)
        for event in self.events:
            if event.kind == "notice":
                notices[event.pool] = notices.get(event.pool, 0) + 1
        for pool in pools:
            figures.append(
                Figure(f"{pool}.notices_per_day", f"{pool} notices/day", notices[pool] * per_day)
            )
            short = max(
                (max(step.floor_gpus - step.held_gpus, 0) for step in self._pool(pool)), default=0
            )
            figures.append(
                Figure(f"{pool}.most_below_floor", f"{pool} most GPUs below floor", short)
            )
        deployments = [d.deployment for d in self.steps[0].deployments] if self.steps else []
        for slug in deployments:
            records = self._deployment(slug)
            figures.append(
                Figure(
                    f"{slug}.p99_wait",
                    f"{slug} p99 queue wait",
                    _weighted_p99(records),
                    "s",
                )
            )
            for key, words in (("over_threshold", "waited too long"), ("refused", "refused")):
                total = sum(getattr(record, key) for record in records)
                figures.append(
                    Figure(f"{slug}.{key}_per_day", f"{slug} requests {words}/day", total * per_day)
                )
            figures.append(
                Figure(
                    f"{slug}.most_queued",
                    f"{slug} most queued",
                    max((record.queue for record in records), default=0),
                )
            )
        resumes = sum(step.resumes for step in self.steps)
        figures.append(Figure("resumes_per_day", "spot resumes/day", resumes * per_day))
        return figures

    def _pool(self, name: str) -> list[PoolStep]:
        return [pool for step in self.steps for pool in step.pools if pool.pool == name]

    def _deployment(self, slug: str) -> list[DeploymentStep]:
        return [d for step in self.steps for d in step.deployments if d.deployment == slug]


def compare(a: SimulationResult, b: SimulationResult) -> list[Difference]:
    """The numbers that differ from run ``a`` to run ``b`` ("spot notices/day 212 → 38"), in
    the order of ``a``'s figures; a figure only one run has is left out."""
    theirs = {figure.key: figure for figure in b.figures()}
    differences = []
    for figure in a.figures():
        other = theirs.get(figure.key)
        if other is not None and figure.shown() != other.shown():
            differences.append(Difference(figure.label, figure, other))
    return differences


def _weighted_p99(records: Sequence[DeploymentStep]) -> float | None:
    """The day's p99 queue wait: the wait that 99% of the requests did not exceed, taking each
    step's requests to wait that step's p99 (None: some waited for a replica unboundedly)."""
    total = sum(record.arrived for record in records)
    if total <= 0:
        return 0.0
    ordered = sorted(
        records,
        key=lambda record: math.inf if record.wait_p99_seconds is None else record.wait_p99_seconds,
    )
    seen = 0.0
    for record in ordered:
        seen += record.arrived
        if seen >= 0.99 * total:
            return record.wait_p99_seconds
    return ordered[-1].wait_p99_seconds

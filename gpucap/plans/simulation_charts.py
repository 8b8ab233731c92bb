"""A load simulation's result drawn (issue 21): server-side SVG charts from one stored result
(``gpucap.simulation.codec.result_to_dict``), with the shared charts of ``gpucap.web.charts``.

Per deployment, its replicas (ready and live) against its load, inside the replica range then in
force; per pool, the GPUs held against the floor then in force, and the GPUs asked for and still
pending; the notices issued and the spot VMs resumed per hour; per deployment, its queue and the
requests that waited too long or were refused.

A day at one-minute steps is 1,440 steps: they are drawn in at most ``MAX_BUCKETS`` buckets of a
round length. A bucket shows the most of its steps for what a spike must not hide (queue,
requests waiting too long or refused, pending GPUs), the last for states (replicas, GPUs held,
floors, ranges) and the mean for the load. Notices and resumes are counted per UTC hour.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpucap.web.charts import (
    KIND_COLOURS,
    Band,
    Bucket,
    Chart,
    Line,
    Series,
    number,
    stacked_bars,
    step_lines,
)

MAX_BUCKETS = 48
# Counts' axes reach 4 at least, so a count of 1 or 2 is not drawn on fractional gridlines.
COUNT_AXIS = 4
# Bucket lengths a reader can count in, in seconds.
ROUND_SECONDS = (60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
WIDTH = 660  # two columns of charts on a desktop page
HEIGHT = 220

READY = KIND_COLOURS["inference"]
LIVE = "#5b2fb3"
LOAD = "#e8590c"
FLOOR = "#495057"
PENDING = "#ffc078"
NOTICES = "#e8590c"
RESUMES = KIND_COLOURS["spot"]
QUEUE = "#1971c2"
LATE = "#f08c00"
REFUSED = "#c92a2a"
# A pool whose kind the caller did not give.
UNKNOWN_KIND = "#868e96"


@dataclass(frozen=True)
class SimulationCharts:
    """Everything drawn of one result, grouped as the page shows it."""

    replicas: list[Chart]  # one per deployment
    pools: list[Chart]  # one per pool, in rank order
    notices: Chart
    queues: list[Chart]  # one per deployment

    @property
    def all(self) -> list[Chart]:
        return [*self.replicas, *self.pools, self.notices, *self.queues]


def simulation_charts(
    result: Mapping,
    *,
    kinds: Mapping[str, str] | None = None,
    prefix: str = "sim",
    reach: Mapping[str, float] | None = None,
) -> SimulationCharts:
    """The charts of one result dict. ``kinds`` maps pool names to their kind (colours);
    ``prefix`` keeps the charts' ids apart when two results share a page; ``reach`` maps a
    chart's id without its prefix (``pool-0``) to a value its axis must reach, so two runs'
    twin charts share a scale."""
    timeline = Timeline.of(result)
    reach = reach or {}

    def least(name: str) -> float:
        return max(COUNT_AXIS, reach.get(name, 0))

    steps = result["steps"]
    deployments = steps["deployments"]
    pools = sorted(steps["pools"].items(), key=lambda item: _first(item[1]["rank"], 0))
    return SimulationCharts(
        replicas=[
            replicas_chart(
                timeline,
                slug,
                series,
                chart_id=f"{prefix}-replicas-{n}",
                least=least(f"replicas-{n}"),
            )
            for n, (slug, series) in enumerate(deployments.items())
        ],
        pools=[
            pool_chart(
                timeline,
                name,
                series,
                kind=(kinds or {}).get(name, ""),
                chart_id=f"{prefix}-pool-{n}",
                least=least(f"pool-{n}"),
            )
            for n, (name, series) in enumerate(pools)
        ],
        notices=notices_chart(result, chart_id=f"{prefix}-notices", least=least("notices")),
        queues=[
            queue_chart(
                timeline,
                slug,
                series,
                chart_id=f"{prefix}-queue-{n}",
                least=least(f"queue-{n}"),
            )
            for n, (slug, series) in enumerate(deployments.items())
        ],
    )


@dataclass(frozen=True)
class Timeline:
    """A result's steps grouped into buckets of ``per_bucket`` steps from its start."""

    start: datetime
    step_seconds: int
    steps: int
    per_bucket: int

    @classmethod
    def of(cls, result: Mapping) -> Timeline:
        step_seconds = int(result["step_seconds"])
        steps = len(result["steps"]["at"])
        least = max(-(-steps // MAX_BUCKETS), 1)
        per_bucket = next(
            (
                seconds // step_seconds
                for seconds in ROUND_SECONDS
                if seconds % step_seconds == 0 and seconds // step_seconds >= least
            ),
            least,
        )
        return cls(_parse(result["start"]), step_seconds, steps, per_bucket)

    @property
    def bucket_seconds(self) -> int:
        return self.per_bucket * self.step_seconds

    @property
    def buckets(self) -> list[Bucket]:
        count = -(-self.steps // self.per_bucket)
        length = timedelta(seconds=self.bucket_seconds)
        moments = [self.start + n * length for n in range(count)]
        return [
            Bucket(
                key=f"{moment:%Y-%m-%dT%H:%MZ}",
                tick=_tick(moment),
                title=f"{moment:%a %H:%M}"
                + (f" to {moment + length:%H:%M}" if self.per_bucket > 1 else "")
                + " UTC",
            )
            for moment in moments
        ]

    def most(self, values: Sequence) -> list[float | None]:
        return self._fold(values, max)

    def last(self, values: Sequence) -> list[float | None]:
        return self._fold(values, lambda chunk: chunk[-1])

    def mean(self, values: Sequence) -> list[float | None]:
        return self._fold(values, lambda chunk: sum(chunk) / len(chunk))

    def _fold(self, values: Sequence, fold: Callable) -> list[float | None]:
        folded = []
        for first in range(0, self.steps, self.per_bucket):
            chunk = [v for v in values[first : first + self.per_bucket] if v is not None]
            folded.append(float(fold(chunk)) if chunk else None)
        return folded


def replicas_chart(
    timeline: Timeline, slug: str, series: Mapping, *, chart_id: str, least: float = 4
) -> Chart:
    """A deployment's replicas, ready and live, against its load, inside its range in force."""
    ready, live = timeline.last(series["ready"]), timeline.last(series["replicas"])
    low, high = timeline.last(series["min_replicas"]), timeline.last(series["max_replicas"])
    load = timeline.mean(series["rps"])
    tips = [
        f"{bucket.title} · {_n(ready[n])} ready, {_n(live[n])} live, "
        f"allowed {_n(low[n])} to {_n(high[n])} · {_n(load[n], 1)} requests/s"
        for n, bucket in enumerate(timeline.buckets)
    ]
    title = f"{slug}: replicas against load"
    svg = step_lines(
        chart_id=chart_id,
        title=title,
        unit="replicas",
        right_unit="requests/s",
        buckets=timeline.buckets,
        band=Band("range", "Replicas allowed", READY, _zeros(low), _zeros(high)),
        lines=[
            Line("ready", "Ready", READY, ready),
            Line("live", "Live (ready or starting)", LIVE, live, dashed=True),
            Line("load", "Load (right axis)", LOAD, load, right=True),
        ],
        tips=tips,
        least=least,
        width=WIDTH,
        height=HEIGHT,
        empty_text="No replica and no load in this run.",
    )
    caption = (
        f"Replicas at the end of each {_duration(timeline.bucket_seconds)}; "
        "load is the mean requests per second then."
    )
    return Chart(chart_id, title, caption, svg)


def pool_chart(
    timeline: Timeline,
    name: str,
    series: Mapping,
    *,
    kind: str,
    chart_id: str,
    least: float = 4,
) -> Chart:
    """A pool's GPUs held against its floor in force, and the GPUs asked for and pending."""
    held, floor = timeline.last(series["held_gpus"]), timeline.last(series["floor_gpus"])
    pending = timeline.most(series["pending_gpus"])
    tips = [
        f"{bucket.title} · {_n(held[n])} GPUs held, floor {_n(floor[n])}"
        + (f", up to {_n(pending[n])} pending" if pending[n] else "")
        for n, bucket in enumerate(timeline.buckets)
    ]
    rank = _first(series["rank"], "")
    title = f"{rank}. {name}: GPUs held against the floor"
    svg = step_lines(
        chart_id=chart_id,
        title=title,
        unit="GPUs",
        buckets=timeline.buckets,
        bars=[Series("pending", "Pending (most)", PENDING, _zeros(pending))],
        lines=[
            Line("held", "Held", KIND_COLOURS.get(kind, UNKNOWN_KIND), held),
            Line("floor", "Floor in force", FLOOR, floor, dashed=True),
        ],
        tips=tips,
        least=least,
        width=WIDTH,
        height=HEIGHT,
        empty_text="This pool held no GPU in this run.",
    )
    caption = f"GPUs held at the end of each {_duration(timeline.bucket_seconds)}."
    return Chart(chart_id, title, caption, svg)


def notices_chart(result: Mapping, *, chart_id: str, least: float = 4) -> Chart:
    """Notices issued and spot VMs resumed, per UTC hour."""
    steps = result["steps"]
    hours: dict[datetime, list[int]] = {}
    for at, notices, resumes in zip(steps["at"], steps["notices"], steps["resumes"], strict=True):
        hour = _parse(at).replace(minute=0, second=0, microsecond=0)
        counts = hours.setdefault(hour, [0, 0])
        counts[0] += notices
        counts[1] += resumes
    buckets = [
        Bucket(
            key=f"{hour:%Y-%m-%dT%H:%MZ}",
            tick=_tick(hour),
            title=f"{hour:%a %H}:00 to {hour:%H}:59 UTC",
        )
        for hour in hours
    ]
    title = "Notices issued and VMs resumed per hour"
    svg = stacked_bars(
        chart_id=chart_id,
        title=title,
        unit="VMs",
        buckets=buckets,
        series=[
            Series("notices", "Notices issued", NOTICES, [c[0] for c in hours.values()]),
            Series("resumes", "Spot VMs resumed", RESUMES, [c[1] for c in hours.values()]),
        ],
        digits=0,
        least=least,
        width=WIDTH,
        height=HEIGHT,
        empty_text="No notice and no resume in this run.",
    )
    return Chart(chart_id, title, "Counted per UTC hour.", svg)


def queue_chart(
    timeline: Timeline, slug: str, series: Mapping, *, chart_id: str, least: float = 4
) -> Chart:
    """A deployment's queue, and the requests that waited too long or were refused."""
    queue = timeline.most(series["queue"])
    late, refused = timeline.most(series["over_threshold"]), timeline.most(series["refused"])
    tips = [
        f"{bucket.title} · queue up to {_n(queue[n])}; in one step up to {_n(late[n])} "
        f"waited too long, {_n(refused[n])} refused"
        for n, bucket in enumerate(timeline.buckets)
    ]
    title = f"{slug}: queue and requests not served in time"
    svg = step_lines(
        chart_id=chart_id,
        title=title,
        unit="requests",
        buckets=timeline.buckets,
        bars=[
            Series("over_threshold", "Waited too long", LATE, _zeros(late)),
            Series("refused", "Refused", REFUSED, _zeros(refused)),
        ],
        lines=[Line("queue", "Queued", QUEUE, queue)],
        tips=tips,
        least=least,
        width=WIDTH,
        height=HEIGHT,
        digits=0,
        empty_text="Nothing queued, waited too long or was refused.",
    )
    caption = (
        f"The most in any step of each {_duration(timeline.bucket_seconds)}, "
        "so a short spike still shows."
    )
    return Chart(chart_id, title, caption, svg)


def _parse(moment: str) -> datetime:
    return datetime.fromisoformat(moment.replace("Z", "+00:00"))


def _tick(moment: datetime) -> str:
    """The date at midnight, the hour on the hour, nothing between (thinned to fit later)."""
    if moment.minute or moment.second:
        return ""
    if moment.hour == 0:
        return f"{moment:%b} {moment.day}"
    return f"{moment:%H}:00"


def _duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return "hour" if hours == 1 else f"{hours} hours"
    if seconds % 60 == 0:
        minutes = seconds // 60
        return "minute" if minutes == 1 else f"{minutes} minutes"
    return f"{seconds} s"


def _first(values: Sequence, default):
    return values[0] if values else default


def _zeros(values: Sequence[float | None]) -> list[float]:
    return [0.0 if value is None else value for value in values]


def _n(value: float | None, digits: int | None = None) -> str:
    return "—" if value is None else number(value, digits)

"""Charts drawn on the server as inline SVG: no JavaScript, no chart library, no CDN.

Pure functions from series to markup. A chart is stacked bars, one bar per bucket (a day, an
hour), one coloured segment per series, with a y axis in the chart's unit, dates along the x
axis, a legend, and a ``<title>`` tooltip on every segment. Every segment carries its series,
bucket and value as ``data-`` attributes, so what a chart says can be read back and checked.
Pool kinds have the GPU grid's colours (``--held-*`` in static/gpucap.css).
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from xml.sax.saxutils import escape, quoteattr

from django.utils.safestring import SafeString, mark_safe

# The GPU grid's colours for GPUs held by each pool kind, with the same values as fallbacks.
KIND_COLOURS = {
    "on_demand": "var(--held-on_demand, #4c8ef0)",
    "spot": "var(--held-spot, #0ca678)",
    "inference": "var(--held-inference, #9a74eb)",
}
# A set may have several pools of one kind: each gets a shade of its kind's colour.
KIND_SHADES = {
    "on_demand": ["var(--held-on_demand, #4c8ef0)", "#1c4f9c", "#8fb3ef", "#2f6fd0"],
    "spot": ["var(--held-spot, #0ca678)", "#0b6e4f", "#63c7a6", "#099268"],
    "inference": ["var(--held-inference, #9a74eb)", "#5b2fb3", "#c4aef5", "#7048e8"],
}
# Tenants: distinct colours that are not the pool kinds' own, then grey for the rest.
PALETTE = ["#e8590c", "#1971c2", "#2b8a3e", "#c2255c", "#f08c00", "#5f3dc4", "#0c8599", "#862e9c"]
OTHERS_COLOUR = "#adb5bd"

WIDTH = 660  # two charts side by side on a usage page
HEIGHT = 230
FONT = 11
LEFT, RIGHT, BOTTOM = 56, 12, 30
LEGEND_LINE = 16
# Roughly how wide a character of the chart's font is, to lay the legend out in lines.
CHAR_WIDTH = 6.2


@dataclass(frozen=True)
class Series:
    key: str  # machine-readable (data-series)
    label: str
    colour: str  # any CSS colour, var() included
    values: Sequence[float]  # one per bucket


@dataclass(frozen=True)
class Bucket:
    key: str  # machine-readable (data-bucket): 2026-11-02, 2026-11-02T10:00Z
    tick: str  # text under the axis; "" for none (ticks are thinned to fit anyway)
    title: str  # the bucket as the tooltip names it


def stacked_bars(
    *,
    chart_id: str,
    title: str,
    unit: str,
    buckets: Sequence[Bucket],
    series: Sequence[Series],
    empty_text: str = "Nothing to draw in this period.",
    digits: int = 1,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> SafeString:
    """Stacked bars: ``series`` in order from the axis up, one bar per bucket."""
    series = [replace(s, values=[float(v) for v in s.values]) for s in series]
    legend, legend_height = _legend(series, width)
    top = legend_height + 10
    plot_width = width - LEFT - RIGHT
    plot_height = height - top - BOTTOM
    totals = [sum(s.values[n] for s in series) for n in range(len(buckets))]
    peak = max(totals, default=0)
    step, axis_max = _nice_axis(peak)
    scale = plot_height / axis_max
    bottom = top + plot_height
    slot = plot_width / max(len(buckets), 1)
    # Wide bars stand apart; narrow ones (hours of a week) touch, and read as an area.
    gap = min(2.0, slot * 0.2) if slot >= 8 else 0.0

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart-svg" id={quoteattr(chart_id)} '
        f'viewBox="0 0 {width} {height}" role="img" aria-labelledby="{chart_id}-title" '
        f'data-unit={quoteattr(unit)} data-max="{_num(axis_max)}" font-size="{FONT}">',
        f'<title id="{chart_id}-title">{escape(title)}</title>',
        legend,
    ]
    # The y axis: gridlines and values.
    parts.append('<g class="axis axis-y">')
    value = 0.0
    while value <= axis_max + step / 1000:
        y = bottom - value * scale
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{width - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_num(value)}</text>'
        )
        value += step
    middle = top + plot_height / 2
    parts.append(
        f'<text class="axis-title" x="12" y="{middle:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {middle:.1f})">{escape(unit)}</text></g>'
    )
    # Under the bars, one invisible column per bucket whose tooltip is the bucket's total.
    parts.append('<g class="columns">')
    for n, bucket in enumerate(buckets):
        total = f"{_num(totals[n], digits)} {unit}"
        parts.append(
            f'<rect class="column" x="{LEFT + n * slot:.2f}" y="{top}" width="{slot:.2f}" '
            f'height="{plot_height}" fill="transparent" data-bucket={quoteattr(bucket.key)}>'
            f"<title>{escape(bucket.title)}: {escape(total)} in all</title></rect>"
        )
    parts.append("</g>")
    # The bars, one group per series.
    # Touching bars overlap by a hair and snap to pixels, so no seam shows between them.
    crisp = "" if gap else ' shape-rendering="crispEdges"'
    parts.append(f'<g class="bars"{crisp}>')
    bar_width = slot - gap if gap else slot + 0.5
    stacked = [0.0] * len(buckets)
    for s in series:
        parts.append(
            f'<g class="series" data-series={quoteattr(s.key)} data-label={quoteattr(s.label)} '
            f'style="fill: {s.colour}">'
        )
        for n, bucket in enumerate(buckets):
            value = s.values[n]
            if value <= 0:
                continue
            y = bottom - (stacked[n] + value) * scale
            tip = f"{bucket.title} · {s.label}: {_num(value, digits)} {unit}"
            parts.append(
                f'<rect x="{LEFT + n * slot + gap / 2:.2f}" y="{y:.2f}" '
                f'width="{bar_width:.2f}" height="{value * scale:.2f}" '
                f'data-bucket={quoteattr(bucket.key)} data-value="{value:.3f}">'
                f"<title>{escape(tip)}</title></rect>"
            )
            stacked[n] += value
        parts.append("</g>")
    parts.append("</g>")
    # The x axis: a baseline and the bucket ticks that fit.
    parts.append(
        f'<g class="axis axis-x"><line class="baseline" x1="{LEFT}" x2="{width - RIGHT}" '
        f'y1="{bottom}" y2="{bottom}"/>'
    )
    for n in _thinned_ticks(buckets, plot_width):
        x = LEFT + (n + 0.5) * slot
        parts.append(
            f'<line class="tick" x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}"/>'
            f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
            f"{escape(buckets[n].tick)}</text>"
        )
    parts.append("</g>")
    if peak <= 0:
        parts.append(
            f'<text class="chart-empty" x="{LEFT + plot_width / 2:.1f}" '
            f'y="{top + plot_height / 2:.1f}" text-anchor="middle">{escape(empty_text)}</text>'
        )
    parts.append("</svg>")
    # Every text and attribute above is escaped; colours are this module's own.
    return mark_safe("".join(parts))


def top_series(
    values: Mapping[str, Sequence[float]],
    *,
    labels: Mapping[str, str],
    n: int,
    others_label: str = "Others",
) -> list[Series]:
    """The ``n`` keys with the largest totals as their own series (largest at the bottom of
    the stack), the rest summed into one grey series."""
    values = {key: [float(v) for v in row] for key, row in values.items()}
    ranked = sorted(values, key=lambda key: (-sum(values[key]), labels[key]))
    shown, rest = ranked[:n], ranked[n:]
    series = [
        Series(key=key, label=labels[key], colour=PALETTE[i % len(PALETTE)], values=values[key])
        for i, key in enumerate(shown)
    ]
    if rest:
        length = len(values[rest[0]])
        summed = [sum(values[key][i] for key in rest) for i in range(length)]
        label = f"{others_label} ({len(rest)})"
        series.append(Series(key="others", label=label, colour=OTHERS_COLOUR, values=summed))
    return series


def _legend(series: Sequence[Series], width: int) -> tuple[str, int]:
    """The legend, laid out in lines across the top; and how tall it is."""
    parts = ['<g class="legend">']
    x, line = float(LEFT), 0
    for s in series:
        item = 14 + len(s.label) * CHAR_WIDTH + 16
        if x + item > width - RIGHT and x > LEFT:
            x, line = float(LEFT), line + 1
        y = 4 + line * LEGEND_LINE
        parts.append(
            f'<g class="legend-item" data-series={quoteattr(s.key)}>'
            f'<rect x="{x:.1f}" y="{y}" width="10" height="10" rx="2" style="fill: {s.colour}"/>'
            f'<text x="{x + 14:.1f}" y="{y + 9}">{escape(s.label)}</text></g>'
        )
        x += item
    parts.append("</g>")
    lines = line + 1 if series else 0
    return "".join(parts), lines * LEGEND_LINE


def _nice_axis(peak: float) -> tuple[float, float]:
    """A round step (1, 2 or 5 times a power of ten) giving four or five gridlines, and the
    axis maximum: the first step at or above ``peak``."""
    if peak <= 0:
        return 1.0, 4.0
    raw = peak / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return step, math.ceil(peak / step - 1e-9) * step


def _thinned_ticks(buckets: Sequence[Bucket], plot_width: float) -> list[int]:
    """The buckets whose tick text is drawn: every k-th of those that have one, so labels
    stay about 64 px apart."""
    candidates = [n for n, bucket in enumerate(buckets) if bucket.tick]
    fit = max(int(plot_width // 64), 1)
    every = math.ceil(len(candidates) / fit) if candidates else 1
    return candidates[::every]


def _num(value: float, digits: int | None = None) -> str:
    """1200 -> "1,200", 2.5 -> "2.5"; with ``digits``, rounded to that many decimals."""
    if digits is not None:
        return f"{value:,.{digits}f}"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


# --- the charts the pages show -----------------------------------------------------------------


@dataclass(frozen=True)
class Chart:
    chart_id: str
    title: str
    caption: str
    svg: SafeString


KIND_LABELS = {"on_demand": "On-demand", "spot": "Spot", "inference": "Inference"}
TOP_TENANTS = 6


def daily_buckets(days: Sequence) -> list[Bucket]:
    return [
        Bucket(key=day.isoformat(), tick=f"{day:%b} {day.day}", title=f"{day:%a %Y-%m-%d}")
        for day in days
    ]


def usage_by_kind_chart(summary, *, chart_id: str = "usage-by-kind") -> Chart:
    """GPU-hours per day, stacked per pool kind (``selectors.UsageSummary``)."""
    title = "GPU-hours per day by pool kind"
    series = [
        Series(key=kind, label=KIND_LABELS[kind], colour=KIND_COLOURS[kind], values=values)
        for kind, values in summary.daily_by_kind.items()
        if summary.by_kind[kind] > 0
    ]
    svg = stacked_bars(
        chart_id=chart_id,
        title=title,
        unit="GPU-hours",
        buckets=daily_buckets(summary.days),
        series=series,
        empty_text="No GPU time in this period.",
    )
    return Chart(chart_id, title, "Whole UTC days; open VMs counted up to now.", svg)


def usage_by_tenant_chart(summary, *, chart_id: str = "usage-by-tenant") -> Chart:
    """GPU-hours per day, stacked per tenant: the top tenants, the rest as one series."""
    title = "GPU-hours per day by tenant"
    labels = {usage.slug: usage.name for usage in summary.tenants}
    series = top_series(summary.daily_by_tenant, labels=labels, n=TOP_TENANTS)
    svg = stacked_bars(
        chart_id=chart_id,
        title=title,
        unit="GPU-hours",
        buckets=daily_buckets(summary.days),
        series=series,
        empty_text="No GPU time in this period.",
    )
    caption = f"The {TOP_TENANTS} largest tenants of the period; the rest together in grey."
    return Chart(chart_id, title, caption, svg)


def gpus_held_chart(held, *, chart_id: str = "gpus-held") -> Chart:
    """Average GPUs held per pool in each step (``selectors.GpusHeld``), stacked in rank
    order, each pool in a shade of its kind's colour."""
    title = "GPUs held per pool"
    used: dict[str, int] = {}
    series = []
    for pool_held in held.pools:
        kind = pool_held.pool.kind
        shades = KIND_SHADES[kind]
        colour = shades[used.get(kind, 0) % len(shades)]
        used[kind] = used.get(kind, 0) + 1
        label = f"{pool_held.pool.rank}. {pool_held.pool.name}"
        series.append(
            Series(key=pool_held.pool.name, label=label, colour=colour, values=pool_held.gpus)
        )
    hourly = held.step.total_seconds() <= 3600
    short = len(held.steps) <= 48  # a day or two: hours are worth a tick too
    buckets = [
        Bucket(
            key=f"{moment:%Y-%m-%dT%H:%MZ}",
            tick=_hour_tick(moment, with_hours=short),
            title=f"{moment:%a %Y-%m-%d %H:%M} UTC" + ("" if hourly else f" +{held.step}"),
        )
        for moment in held.steps
    ]
    svg = stacked_bars(
        chart_id=chart_id,
        title=title,
        unit="GPUs",
        width=1200,
        height=250,  # a page-wide panel, and up to 180 bars
        buckets=buckets,
        series=series,
        empty_text="No GPU held by this set's pools in this time.",
    )
    step = "hour" if hourly else f"{int(held.step.total_seconds() // 3600)} hours"
    caption = f"Average GPUs each pool held per {step} (UTC), from the VMs' usage intervals."
    return Chart(chart_id, title, caption, svg)


def _hour_tick(moment, *, with_hours: bool) -> str:
    """A step's tick: the date at midnight; with ``with_hours``, every sixth hour too."""
    if moment.hour == 0 and moment.minute == 0:
        return f"{moment:%b} {moment.day}"
    if with_hours and moment.hour % 6 == 0 and moment.minute == 0:
        return f"{moment:%H:%M}"
    return ""

"""Charts drawn on the server as inline SVG, shared by the pages that draw them (usage, the load
simulation): no JavaScript, no chart library, no CDN.

Pure functions from series to markup. Every mark carries what it shows as ``data-`` attributes,
so what a chart says can be read back and checked, and has a ``<title>`` tooltip. A chart has a
y axis in its unit, times or dates along the x axis and a legend. Pool kinds have the GPU grid's
colours (``--held-*`` in static/gpucap.css). ``stacked_bars`` draws bars per bucket;
``step_lines`` draws step lines over buckets (replicas, GPUs held, a floor), with an optional
band, bars under them and a second axis on the right.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from xml.sax.saxutils import escape, quoteattr

from django.utils.safestring import SafeString, mark_safe

from gpucap.web.chart_frame import LEFT, RIGHT, Band, Bucket, Frame, Line, Series, number

# What a chart is drawn from lives with the frame; the pages import it from here.
__all__ = [
    "Band",
    "Bucket",
    "Chart",
    "Line",
    "Series",
    "hour_tick",
    "legend",
    "number",
    "stacked_bars",
    "step_lines",
    "top_series",
]

# The GPU grid's colours for GPUs held by each pool kind, with the same values as fallbacks.
KIND_COLOURS = {
    "on_demand": "var(--held-on_demand, #4c8ef0)",
    "spot": "var(--held-spot, #0ca678)",
    "inference": "var(--held-inference, #9a74eb)",
    "bare_metal": "var(--held-bare_metal, #b08900)",
}
KIND_LABELS = {
    "on_demand": "On-demand",
    "spot": "Spot",
    "inference": "Inference",
    "bare_metal": "Bare metal",
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
LEGEND_LINE = 16
# Roughly how wide a character of the chart's font is, to lay the legend out in lines.
CHAR_WIDTH = 6.2


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
    least: float = 0,
) -> SafeString:
    """Stacked bars: ``series`` in order from the axis up, one bar per bucket."""
    series = [replace(s, values=[float(v) for v in s.values]) for s in series]
    frame = Frame.of(legend(series, width), buckets=buckets, width=width, height=height)
    totals = [sum(s.values[n] for s in series) for n in range(len(buckets))]
    peak = max(totals, default=0)
    scale = frame.y_axis(max(peak, least))
    parts = [
        frame.open(chart_id, title, unit, scale),
        frame.axis_y(unit, scale),
        # Under the bars, one invisible column per bucket whose tooltip is the bucket's total.
        frame.columns(
            [
                f"{bucket.title}: {number(totals[n], digits)} {unit} in all"
                for n, bucket in enumerate(buckets)
            ]
        ),
        frame.bars(series, scale, unit=unit, digits=digits),
        frame.axis_x(),
    ]
    if peak <= 0:
        parts.append(frame.empty(empty_text))
    parts.append("</svg>")
    # Every text and attribute above is escaped; colours are this module's own.
    return mark_safe("".join(parts))


@dataclass(frozen=True)
class Chart:
    """A chart as a page shows it: the SVG under a title, with a caption."""

    chart_id: str
    title: str
    caption: str
    svg: SafeString


def step_lines(
    *,
    chart_id: str,
    title: str,
    unit: str,
    buckets: Sequence[Bucket],
    lines: Sequence[Line],
    tips: Sequence[str],
    band: Band | None = None,
    bars: Sequence[Series] = (),
    right_unit: str = "",
    empty_text: str = "Nothing to draw in this period.",
    digits: int = 1,
    width: int = WIDTH,
    height: int = HEIGHT,
    least: float = 0,
) -> SafeString:
    """Step lines over buckets, with an optional band and stacked ``bars`` behind them, all on
    the left axis except the lines marked ``right`` (on a second axis in ``right_unit``); the
    left axis reaches ``least`` at least (4 keeps counts off fractional gridlines).
    ``tips`` is each bucket's tooltip. Each line's values are on its path as ``data-values``,
    one per bucket in the order of the columns' ``data-bucket``."""
    bars = [replace(s, values=[float(v) for v in s.values]) for s in bars]
    keyed = [*([band] if band else []), *bars, *lines]
    frame = Frame.of(
        legend(keyed, width), buckets=buckets, width=width, height=height, right=bool(right_unit)
    )
    left = [line for line in lines if not line.right]
    right = [line for line in lines if line.right]
    totals = [sum(s.values[n] for s in bars) for n in range(len(buckets))]
    peak = max([*totals, *_values(left), *(band.high if band else ())], default=0)
    scale = frame.y_axis(max(peak, least))
    parts = [frame.open(chart_id, title, unit, scale), frame.axis_y(unit, scale)]
    right_scale = scale
    if right_unit:
        right_scale = frame.y_axis(max(_values(right), default=0))
        parts.append(frame.axis_y(right_unit, right_scale, side="right"))
    parts.append(frame.columns(tips))
    if band:
        parts.append(frame.band(band, scale))
    parts.append(frame.bars(bars, scale, unit=unit, digits=digits, titled=False))
    parts.append('<g class="lines" fill="none" stroke-linejoin="round">')
    for line in lines:
        parts.append(frame.line(line, right_scale if line.right else scale))
    parts.append("</g>")
    parts.append(frame.axis_x(at_start=True))
    if peak <= 0 and max(_values(right), default=0) <= 0:
        parts.append(frame.empty(empty_text))
    parts.append("</svg>")
    # Every text and attribute above is escaped; colours are the callers' own constants.
    return mark_safe("".join(parts))


def _values(lines: Sequence[Line]) -> list[float]:
    return [value for line in lines for value in line.values if value is not None]


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


def legend(series: Sequence[Series | Line | Band], width: int) -> tuple[str, int]:
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
            f"{_swatch(s, x, y)}"
            f'<text x="{x + 14:.1f}" y="{y + 9}">{escape(s.label)}</text></g>'
        )
        x += item
    parts.append("</g>")
    lines = line + 1 if series else 0
    return "".join(parts), lines * LEGEND_LINE


def _swatch(item: Series | Line | Band, x: float, y: int) -> str:
    """A box for bars and bands, a short stroke for lines (dashed for a dashed line)."""
    if isinstance(item, Line):
        dash = ' stroke-dasharray="4 2"' if item.dashed else ""
        return (
            f'<line x1="{x:.1f}" x2="{x + 10:.1f}" y1="{y + 5}" y2="{y + 5}" '
            f'style="stroke: {item.colour}" stroke-width="2"{dash}/>'
        )
    opacity = ' fill-opacity="0.3"' if isinstance(item, Band) else ""
    return (
        f'<rect x="{x:.1f}" y="{y}" width="10" height="10" rx="2" '
        f'style="fill: {item.colour}"{opacity}/>'
    )


def hour_tick(moment, *, with_hours: bool) -> str:
    """A step's tick: the date at midnight; with ``with_hours``, every sixth hour too."""
    if moment.hour == 0 and moment.minute == 0:
        return f"{moment:%b} {moment.day}"
    if with_hours and moment.hour % 6 == 0 and moment.minute == 0:
        return f"{moment:%H:%M}"
    return ""

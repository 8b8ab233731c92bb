"""The parts of a server-side SVG chart (``gpucap.web.charts``): what is drawn (series of bars,
step lines, bands, over buckets), and the frame that draws them: its plot area, axes, columns
with tooltips, stacked bars, step lines and bands, in SVG user units; and the axis arithmetic."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

FONT = 11
LEFT, RIGHT, BOTTOM = 56, 12, 30
RIGHT_AXIS = 52  # the right margin when a second axis is drawn there


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


@dataclass(frozen=True)
class Line:
    """A step line: each bucket's value drawn flat across the bucket; None draws nothing."""

    key: str
    label: str
    colour: str
    values: Sequence[float | None]
    dashed: bool = False
    right: bool = False  # measured on the right axis


@dataclass(frozen=True)
class Band:
    """A shaded range between two step lines (the replicas allowed: min to max)."""

    key: str
    label: str
    colour: str
    low: Sequence[float]
    high: Sequence[float]


@dataclass
class Frame:
    """A chart's plot area and the pieces drawn in it, in SVG user units."""

    buckets: Sequence[Bucket]
    width: int
    height: int
    top: float
    right: int
    legend: str

    @classmethod
    def of(
        cls, legend: tuple[str, int], *, buckets, width: int, height: int, right: bool = False
    ) -> Frame:
        """A frame under ``legend`` (its markup and height); ``right``: room for a second axis."""
        drawn, legend_height = legend
        return cls(
            buckets, width, height, legend_height + 10, RIGHT_AXIS if right else RIGHT, drawn
        )

    @property
    def plot_width(self) -> float:
        return self.width - LEFT - self.right

    @property
    def bottom(self) -> float:
        return self.height - BOTTOM

    @property
    def slot(self) -> float:
        return self.plot_width / max(len(self.buckets), 1)

    def y_axis(self, peak: float) -> tuple[float, float, float]:
        """(step, maximum, pixels per unit) of an axis that holds ``peak``."""
        step, axis_max = nice_axis(peak)
        return step, axis_max, (self.bottom - self.top) / axis_max

    def open(self, chart_id: str, title: str, unit: str, scale) -> str:
        """The root, with the (left) axis's maximum as ``data-max``."""
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="chart-svg" id={quoteattr(chart_id)} '
            f'viewBox="0 0 {self.width} {self.height}" role="img" '
            f'aria-labelledby="{chart_id}-title" data-unit={quoteattr(unit)} '
            f'data-max="{number(scale[1])}" font-size="{FONT}">'
            f'<title id="{chart_id}-title">{escape(title)}</title>{self.legend}'
        )

    def axis_y(self, unit: str, scale: tuple[float, float, float], *, side: str = "left") -> str:
        """Gridlines and values (the right axis: values only), and the unit along the side."""
        step, axis_max, pixels = scale
        right = side == "right"
        x = self.width - self.right + 6 if right else LEFT - 6
        anchor = "start" if right else "end"
        parts = [f'<g class="axis axis-y axis-{side}" data-max="{number(axis_max)}">']
        value = 0.0
        while value <= axis_max + step / 1000:
            y = self.bottom - value * pixels
            if not right:
                parts.append(
                    f'<line class="grid" x1="{LEFT}" x2="{self.width - self.right}" '
                    f'y1="{y:.1f}" y2="{y:.1f}"/>'
                )
            parts.append(
                f'<text x="{x}" y="{y + 4:.1f}" text-anchor="{anchor}">{number(value)}</text>'
            )
            value += step
        middle = self.top + (self.bottom - self.top) / 2
        edge = self.width - 10 if right else 12
        turn = 90 if right else -90
        parts.append(
            f'<text class="axis-title" x="{edge}" y="{middle:.1f}" text-anchor="middle" '
            f'transform="rotate({turn} {edge} {middle:.1f})">{escape(unit)}</text></g>'
        )
        return "".join(parts)

    def columns(self, tips: Sequence[str]) -> str:
        """One invisible column per bucket, its tooltip the bucket's words."""
        parts = ['<g class="columns" fill="transparent">']
        height = self.bottom - self.top
        for n, bucket in enumerate(self.buckets):
            parts.append(
                f'<rect class="column" x="{LEFT + n * self.slot:.1f}" y="{self.top}" '
                f'width="{self.slot:.1f}" height="{height}" data-bucket={quoteattr(bucket.key)}>'
                f"<title>{escape(tips[n])}</title></rect>"
            )
        parts.append("</g>")
        return "".join(parts)

    def bars(
        self, series: Sequence[Series], scale, *, unit: str, digits: int, titled: bool = True
    ) -> str:
        """Stacked bars, one group per series, from the axis up; ``titled``: each with its own
        tooltip (else the columns' tooltips name their values)."""
        pixels = scale[2]
        slot = self.slot
        # Wide bars stand apart; narrow ones (hours of a week) touch, and read as an area.
        gap = min(2.0, slot * 0.2) if slot >= 8 else 0.0
        # Touching bars overlap by a hair and snap to pixels, so no seam shows between them.
        crisp = "" if gap else ' shape-rendering="crispEdges"'
        parts = [f'<g class="bars"{crisp}>']
        bar_width = slot - gap if gap else slot + 0.5
        stacked = [0.0] * len(self.buckets)
        for s in series:
            parts.append(
                f'<g class="series" data-series={quoteattr(s.key)} data-label={quoteattr(s.label)} '
                f'style="fill: {s.colour}">'
            )
            for n, bucket in enumerate(self.buckets):
                value = s.values[n]
                if value <= 0:
                    continue
                y = self.bottom - (stacked[n] + value) * pixels
                tip = f"{bucket.title} · {s.label}: {number(value, digits)} {unit}"
                parts.append(
                    f'<rect x="{LEFT + n * slot + gap / 2:.2f}" y="{y:.2f}" '
                    f'width="{bar_width:.2f}" height="{value * pixels:.2f}" '
                    f'data-bucket={quoteattr(bucket.key)} data-value="{value:.3f}">'
                    + (f"<title>{escape(tip)}</title></rect>" if titled else "</rect>")
                )
                stacked[n] += value
            parts.append("</g>")
        parts.append("</g>")
        return "".join(parts)

    def line(self, line: Line, scale) -> str:
        path = self._steps(line.values, scale[2])
        dash = ' stroke-dasharray="6 4"' if line.dashed else ""
        values = " ".join("-" if v is None else number(v) for v in line.values)
        return (
            f'<path class="line" data-series={quoteattr(line.key)} '
            f'data-label={quoteattr(line.label)} data-values="{values}" d="{path}" '
            f'style="stroke: {line.colour}" stroke-width="2"{dash}/>'
        )

    def band(self, band: Band, scale) -> str:
        pixels = scale[2]
        upper = self._steps(band.high, pixels)
        lower = self._steps(band.low, pixels, backwards=True)
        values = " ".join(
            f"{number(lo)}-{number(hi)}" for lo, hi in zip(band.low, band.high, strict=True)
        )
        return (
            f'<path class="band" data-series={quoteattr(band.key)} '
            f'data-label={quoteattr(band.label)} data-values="{values}" '
            f'd="{upper} {lower.replace("M", "L", 1)} Z" style="fill: {band.colour}" '
            f'fill-opacity="0.14" stroke="none"/>'
        )

    def _steps(self, values: Sequence[float | None], pixels: float, *, backwards=False) -> str:
        """A step path through ``values``: flat across each bucket, upright between them (a
        run of equal values is one flat stroke); None leaves a gap."""
        runs: list[list[str]] = []
        order = range(len(values) - 1, -1, -1) if backwards else range(len(values))
        previous = None
        for n in order:
            value = values[n]
            if value is None:
                previous = None
                continue
            y = self.bottom - value * pixels
            x0 = LEFT + n * self.slot
            x1 = x0 + self.slot
            start, end = (x1, x0) if backwards else (x0, x1)
            if previous is None:
                runs.append([f"M{start:.1f},{y:.1f}"])
            elif previous == value:
                runs[-1].pop()  # the flat stroke goes on to this bucket's end
            else:
                runs[-1].append(f"V{y:.1f}")
            runs[-1].append(f"H{end:.1f}")
            previous = value
        return " ".join("".join(run) for run in runs)

    def axis_x(self, *, at_start: bool = False) -> str:
        """A baseline and the bucket ticks that fit: under each bucket's middle (a day's bar),
        or ``at_start``, on its left edge (a moment on a time axis)."""
        parts = [
            f'<g class="axis axis-x"><line class="baseline" x1="{LEFT}" '
            f'x2="{self.width - self.right}" y1="{self.bottom}" y2="{self.bottom}"/>'
        ]
        for n in thinned_ticks(self.buckets, self.plot_width):
            x = LEFT + (n if at_start else n + 0.5) * self.slot
            parts.append(
                f'<line class="tick" x1="{x:.1f}" x2="{x:.1f}" y1="{self.bottom}" '
                f'y2="{self.bottom + 4}"/><text x="{x:.1f}" y="{self.bottom + 16}" '
                f'text-anchor="middle">{escape(self.buckets[n].tick)}</text>'
            )
        parts.append("</g>")
        return "".join(parts)

    def empty(self, text: str) -> str:
        return (
            f'<text class="chart-empty" x="{LEFT + self.plot_width / 2:.1f}" '
            f'y="{self.top + (self.bottom - self.top) / 2:.1f}" text-anchor="middle">'
            f"{escape(text)}</text>"
        )


def nice_axis(peak: float) -> tuple[float, float]:
    """A round step (1, 2 or 5 times a power of ten) giving four or five gridlines, and the
    axis maximum: the first step at or above ``peak``."""
    if peak <= 0:
        return 1.0, 4.0
    raw = peak / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return step, math.ceil(peak / step - 1e-9) * step


def thinned_ticks(buckets: Sequence[Bucket], plot_width: float) -> list[int]:
    """The buckets whose tick text is drawn: every k-th of those that have one, so labels
    stay about 64 px apart."""
    candidates = [n for n, bucket in enumerate(buckets) if bucket.tick]
    fit = max(int(plot_width // 64), 1)
    every = math.ceil(len(candidates) / fit) if candidates else 1
    return candidates[::every]


def number(value: float, digits: int | None = None) -> str:
    """1200 -> "1,200", 2.5 -> "2.5"; with ``digits``, rounded to that many decimals."""
    if digits is not None:
        return f"{value:,.{digits}f}"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")

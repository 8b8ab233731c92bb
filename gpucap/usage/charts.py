"""The usage pages' charts: GPU-hours per day by pool kind and by tenant, GPUs held per pool.
Drawn with the shared server-side SVG charts of ``gpucap.web.charts``."""

from collections.abc import Sequence

from gpucap.web.charts import (
    KIND_COLOURS,
    KIND_LABELS,
    KIND_SHADES,
    OTHERS_COLOUR,
    Bucket,
    Chart,
    Series,
    hour_tick,
    stacked_bars,
    top_series,
)

__all__ = [
    "OTHERS_COLOUR",
    "Bucket",
    "Chart",
    "Series",
    "daily_buckets",
    "gpus_held_chart",
    "stacked_bars",
    "top_series",
    "usage_by_kind_chart",
    "usage_by_tenant_chart",
]


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
            tick=hour_tick(moment, with_hours=short),
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

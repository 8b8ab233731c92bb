"""Charts drawn server-side as SVG: parsed back, their bars say what the totals say, every
segment has a tooltip, the legend names every series, and the colours are the GPU grid's."""

import xml.etree.ElementTree as ET
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from gpucap.rentals import services as rentals
from gpucap.usage import charts, selectors

SVG = "{http://www.w3.org/2000/svg}"


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, minute, tzinfo=UTC)


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def segments(root: ET.Element) -> dict[str, dict[str, float]]:
    """series key -> bucket key -> value, read from the bars."""
    drawn: dict[str, dict[str, float]] = {}
    for group in root.iter(f"{SVG}g"):
        if group.get("class") == "series":
            drawn[group.get("data-series")] = {
                rect.get("data-bucket"): float(rect.get("data-value"))
                for rect in group.iter(f"{SVG}rect")
            }
    return drawn


def legend(root: ET.Element) -> list[str]:
    return [
        "".join(item.itertext())
        for item in root.iter(f"{SVG}g")
        if item.get("class") == "legend-item"
    ]


BUCKETS = [charts.Bucket(key=f"d{n}", tick=f"Nov {n + 1}", title=f"day {n + 1}") for n in range(4)]


def test_stacked_bars_draw_each_value_as_a_segment_of_proportional_height():
    series = [
        charts.Series(key="spot", label="Spot", colour="#0ca678", values=[1, 0, 3, 2.5]),
        charts.Series(key="a&b", label="A & <B>", colour="#123456", values=[2, 4, 0, 0]),
    ]
    root = parse(
        charts.stacked_bars(
            chart_id="t", title="Test", unit="GPU-hours", buckets=BUCKETS, series=series
        )
    )

    assert segments(root) == {
        "spot": {"d0": 1, "d2": 3, "d3": 2.5},  # zero draws nothing
        "a&b": {"d0": 2, "d1": 4},
    }
    assert legend(root) == ["Spot", "A & <B>"]  # escaped in the markup, read back whole
    assert root.find(f"{SVG}title").text == "Test"
    assert root.get("data-max") == "4"  # the peak, a round number already
    rects = {
        (rect.get("data-bucket"), rect.get("data-value")): rect
        for rect in root.iter(f"{SVG}rect")
        if rect.get("data-value")
    }
    unit = float(rects[("d1", "4.000")].get("height")) / 4
    for (_bucket, value), rect in rects.items():
        assert float(rect.get("height")) == pytest.approx(float(value) * unit, abs=0.01)
    # Stacked: the second series sits on the first in the same bucket.
    spot, other = rects[("d0", "1.000")], rects[("d0", "2.000")]
    assert float(other.get("y")) + float(other.get("height")) == pytest.approx(
        float(spot.get("y")), abs=0.01
    )
    tips = [tip.text for rect in root.iter(f"{SVG}rect") for tip in rect.iter(f"{SVG}title")]
    assert "day 3 · Spot: 3.0 GPU-hours" in tips
    assert "day 1: 3.0 GPU-hours in all" in tips  # the column under each bar


def test_an_empty_chart_says_so():
    series = [charts.Series(key="spot", label="Spot", colour="#0ca678", values=[0, 0, 0, 0])]
    root = parse(
        charts.stacked_bars(
            chart_id="e", title="E", unit="GPUs", buckets=BUCKETS, series=series, empty_text="None."
        )
    )

    assert segments(root) == {"spot": {}}
    assert [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "chart-empty"] == ["None."]


def test_x_axis_ticks_are_thinned_to_fit():
    buckets = [charts.Bucket(key=str(n), tick=f"t{n}", title="") for n in range(366)]
    series = [charts.Series(key="s", label="S", colour="#000", values=[1] * 366)]
    root = parse(
        charts.stacked_bars(chart_id="x", title="X", unit="u", buckets=buckets, series=series)
    )

    axis = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "axis axis-x")
    labels = [t.text for t in axis.iter(f"{SVG}text")]
    assert 6 <= len(labels) <= 13 and labels[0] == "t0"


def test_top_series_keep_the_largest_and_sum_the_rest_as_others():
    values = {"a": [1, 1], "b": [5, 0], "c": [0, 3], "d": [2, 0]}
    labels = {"a": "A", "b": "B", "c": "C", "d": "D"}

    series = charts.top_series(values, labels=labels, n=2)

    assert [(s.key, s.label, list(s.values)) for s in series] == [
        ("b", "B", [5, 0]),
        ("c", "C", [0, 3]),
        ("others", "Others (2)", [3, 1]),
    ]
    assert series[-1].colour == charts.OTHERS_COLOUR


@pytest.fixture
def usage(clock, pools, run_vm, tenant, other_tenant):
    clock.set(at(1, 22))
    a = run_vm(tenant, "h100-spot", "h100-001", [0, 1, 2, 3], name="a")  # 4 GPUs, 22:00-01:30
    clock.set(at(2, 0, 30))
    b = run_vm(other_tenant, "l40s-ondemand", "l40s-001", [0], name="b")  # 1 GPU, 00:30-02:00
    clock.set(at(2, 1, 30))
    rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=a))
    clock.set(at(2, 2))
    rentals.vm_mark_stopped(vm=rentals.vm_stop(vm=b))
    clock.set(at(3, 12))


def test_usage_charts_bars_add_up_to_the_pages_totals(usage):
    summary = selectors.usage_summary(since=at(1, 0), until=at(4, 0))

    by_kind = parse(charts.usage_by_kind_chart(summary).svg)
    assert segments(by_kind) == {
        "on_demand": {"2026-11-02": 1.5},
        "spot": {"2026-11-01": 8.0, "2026-11-02": 6.0},
    }
    for kind, drawn in segments(by_kind).items():
        assert Decimal(str(sum(drawn.values()))) == summary.by_kind[kind]
    assert legend(by_kind) == ["On-demand", "Spot"]
    by_tenant = parse(charts.usage_by_tenant_chart(summary).svg)
    assert segments(by_tenant) == {
        "acme": {"2026-11-01": 8.0, "2026-11-02": 6.0},
        "globex": {"2026-11-02": 1.5},
    }
    assert legend(by_tenant) == ["Acme AI", "Globex Research"]


def test_pool_kinds_have_the_gpu_grids_colours(usage):
    summary = selectors.usage_summary(since=at(1, 0), until=at(4, 0))
    root = parse(charts.usage_by_kind_chart(summary).svg)

    fills = {
        group.get("data-series"): group.get("style")
        for group in root.iter(f"{SVG}g")
        if group.get("class") == "series"
    }
    assert fills == {
        "on_demand": "fill: var(--held-on_demand, #4c8ef0)",
        "spot": "fill: var(--held-spot, #0ca678)",
    }
    css = (Path(__file__).resolve().parents[2] / "static" / "gpucap.css").read_text()
    assert "--held-on_demand: #4c8ef0;" in css and "--held-spot: #0ca678;" in css


def test_allocation_chart_shows_average_gpus_held_per_pool_and_hour(usage, fleet_east):
    held = selectors.gpus_held_per_pool(
        capacity_set=fleet_east["sets"]["h100-east"],
        since=at(1, 21),
        until=at(2, 3),
        step=timedelta(hours=1),
        now=at(3, 12),
    )

    assert [p.pool.name for p in held.pools] == ["h100-inference", "h100-ondemand", "h100-spot"]
    assert held.steps[0] == at(1, 21) and len(held.steps) == 6
    root = parse(charts.gpus_held_chart(held).svg)
    assert segments(root) == {
        "h100-inference": {},
        "h100-ondemand": {},
        # 4 GPUs from 22:00 to 01:30: 4 a whole hour, 2 on average in the half hour.
        "h100-spot": {
            "2026-11-01T22:00Z": 4.0,
            "2026-11-01T23:00Z": 4.0,
            "2026-11-02T00:00Z": 4.0,
            "2026-11-02T01:00Z": 2.0,
        },
    }
    assert legend(root) == ["1. h100-inference", "2. h100-ondemand", "3. h100-spot"]


def test_allocation_counts_a_running_vm_up_to_now_over_the_part_of_the_hour_gone(
    clock, pools, run_vm, tenant, fleet_east
):
    clock.set(at(5, 10))
    run_vm(tenant, "h100-spot", "h100-002", [0, 2], name="running")

    held = selectors.gpus_held_per_pool(
        capacity_set=fleet_east["sets"]["h100-east"],
        since=at(5, 9),
        until=at(5, 11, 15),
        now=at(5, 11, 15),
    )

    spot = held.pools[2]
    assert spot.pool.name == "h100-spot"
    assert spot.gpus == [0, 2, 2]  # the last hour is a quarter gone, and 2 GPUs were held


def test_usage_summary_counts_days_in_utc(usage):
    summary = selectors.usage_summary(since=at(1, 0), until=at(3, 0))

    assert summary.days == [date(2026, 11, 1), date(2026, 11, 2)]
    assert summary.daily_by_kind["spot"] == [8, 6]

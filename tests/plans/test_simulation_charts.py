"""A load simulation's result drawn (issue 21): real results of the small hand-checkable set
(tests/simulation/sets.py), drawn as SVG and rendered by the includable templates. What the
charts say is read back from their data- attributes; no browser, no database."""

import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import time

from django.template.loader import render_to_string

from gpucap.arbiter.model import Deployment, Node, Pool
from gpucap.plans.simulation_charts import simulation_charts
from gpucap.schedules.calendar import FLOOR_GPUS, Change, Entry, Window
from gpucap.simulation import (
    Curve,
    DeploymentLoad,
    Profile,
    compare,
    result_to_dict,
    simulate,
)
from tests.simulation.sets import CHAT, T0, chat_load, full_set, running

SVG = "{http://www.w3.org/2000/svg}"
KINDS = {"chat": "inference", "rent": "on_demand", "spot": "spot"}
# Chat's replicas serve 8 at once here, so 12 requests/s queue until the new replicas are up.
SLOW_CHAT = replace(CHAT, replica_concurrency=8, max_replicas=3)


def run(start=None, profile=None, **options):
    options = {
        "deployments": {"chat": SLOW_CHAT},
        "notice_seconds": 300,
        "duration_seconds": 2 * 3600,
        "startup_seconds": 60,
        **options,
    }
    return simulate(start or full_set(), profile or chat_load((0, 4), (10, 12), (60, 4)), **options)


def charts_of(result, **options):
    return simulation_charts(result_to_dict(result), kinds=KINDS, **options)


def parse(svg) -> ET.Element:
    return ET.fromstring(str(svg))


def line(svg, series: str) -> dict[str, str]:
    """bucket key -> value of one step line (or band), read from its data-values."""
    root = parse(svg)
    buckets = [rect.get("data-bucket") for rect in root.iter(f"{SVG}rect") if _column(rect)]
    path = next(p for p in root.iter(f"{SVG}path") if p.get("data-series") == series)
    values = path.get("data-values").split(" ")
    assert len(values) == len(buckets)
    return dict(zip(buckets, values, strict=True))


def bars(svg, series: str) -> dict[str, float]:
    root = parse(svg)
    group = next(
        g
        for g in root.iter(f"{SVG}g")
        if g.get("class") == "series" and g.get("data-series") == series
    )
    return {rect.get("data-bucket"): float(rect.get("data-value")) for rect in group}


def tips(svg) -> dict[str, str]:
    root = parse(svg)
    return {
        rect.get("data-bucket"): rect.find(f"{SVG}title").text
        for rect in root.iter(f"{SVG}rect")
        if _column(rect)
    }


def _column(rect) -> bool:
    return rect.get("data-bucket") is not None and rect.get("data-value") is None


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def test_the_replicas_chart_shows_the_two_replicas_the_load_step_adds_and_the_range_in_force():
    charts = charts_of(run())
    svg = charts.replicas[0].svg
    # Two hours at one-minute steps: 24 buckets of five minutes, each a state's last value.
    ready = line(svg, "ready")
    assert len(ready) == 24
    assert ready["2026-12-02T08:00Z"] == "1"
    assert ready["2026-12-02T08:30Z"] == "3"
    assert line(svg, "live")["2026-12-02T08:10Z"] == "3"  # asked for at minute 11
    assert line(svg, "load")["2026-12-02T08:10Z"] == "12"  # the mean of 12 requests/s
    assert line(svg, "range")["2026-12-02T08:30Z"] == "1-3"
    assert tips(svg)["2026-12-02T08:30Z"] == (
        "Wed 08:30 to 08:35 UTC · 3 ready, 3 live, allowed 1 to 3 · 12.0 requests/s"
    )
    assert charts.replicas[0].title == "chat: replicas against load"


def test_the_notices_bar_for_the_hour_of_the_reclaim_shows_the_count():
    notices = charts_of(run()).notices.svg
    # spot-4 and spot-3 get notices at 08:11; they resume at 09:11 when the load has fallen.
    assert bars(notices, "notices") == {"2026-12-02T08:00Z": 2.0}
    assert bars(notices, "resumes") == {"2026-12-02T09:00Z": 2.0}
    titles = [t.text for t in parse(notices).iter(f"{SVG}title")]
    assert "Wed 08:00 to 08:59 UTC · Notices issued: 2 VMs" in titles


def test_the_floor_line_moves_at_a_schedule_boundary():
    window = Window(frozenset({T0.weekday()}), time(8, 30), time(9, 30), "UTC")
    keep_spot = Entry("keep-spot", window, (Change(FLOOR_GPUS, "spot", 16),))
    charts = charts_of(run(entries=[keep_spot], profile=chat_load((0, 4), (40, 12), (100, 4))))
    spot = next(chart for chart in charts.pools if chart.title.startswith("3. spot"))
    floor = line(spot.svg, "floor")
    assert (floor["2026-12-02T08:25Z"], floor["2026-12-02T08:30Z"]) == ("0", "16")
    assert (floor["2026-12-02T09:25Z"], floor["2026-12-02T09:30Z"]) == ("16", "0")
    assert line(spot.svg, "held")["2026-12-02T08:30Z"] == "16"
    assert "#0ca678" in str(spot.svg)  # the GPU grid's spot colour


def test_the_downsampled_queue_keeps_the_spikes_most_and_the_pending_gpus_theirs():
    # A day at one-minute steps: 48 buckets of 30 minutes. Chat's load jumps for 5 minutes at
    # 18:00; the queue it builds lasts a few minutes of its bucket.
    result = run(
        profile=chat_load((0, 4), (600, 12), (605, 4)), duration_seconds=86400, worst_count=0
    )
    stored = result_to_dict(result)
    queue = stored["steps"]["deployments"]["chat"]["queue"]
    spike = max(queue[600:630])
    assert spike > 0 and sum(queue[600:630]) / 30 < spike
    charts = simulation_charts(stored, kinds=KINDS)
    drawn = line(charts.queues[0].svg, "queue")
    assert len(drawn) == 48
    assert drawn["2026-12-02T18:00Z"] == f"{spike:g}"
    refused = stored["steps"]["deployments"]["chat"]["refused"]
    assert bars(charts.queues[0].svg, "refused")["2026-12-02T18:00Z"] == max(refused[600:630]) > 0
    pending = stored["steps"]["pools"]["chat"]["pending_gpus"]
    assert bars(charts.pools[0].svg, "pending")["2026-12-02T18:00Z"] == max(pending[600:630])


def test_a_day_with_three_deployments_and_four_pools_stays_small():
    start, profile, specs = big_day()
    result = simulate(start, profile, deployments=specs, notice_seconds=300, startup_seconds=60)
    charts = simulation_charts(result_to_dict(result), kinds=BIG_KINDS)
    assert (len(charts.replicas), len(charts.pools), len(charts.queues)) == (3, 4, 3)
    size = sum(len(chart.svg.encode()) for chart in charts.all)
    assert size < 150_000
    for chart in charts.all:
        root = parse(chart.svg)  # well-formed, and every column and bar has a tooltip
        for rect in root.iter(f"{SVG}rect"):
            if rect.get("data-bucket") and not _in_lines_chart_bars(root, rect):
                assert rect.find(f"{SVG}title") is not None


def test_a_result_renders_its_figures_charts_and_worst_moment_with_the_arbiters_reasons():
    stored = result_to_dict(run())
    html = render_to_string("plans/simulation_result.html", {"result": stored, "pool_kinds": KINDS})
    assert html.count("<svg") == 6  # replicas, three pools, notices, queue
    assert '<div data-figure="spot.notices_per_day"><dt>spot notices/day</dt><dd>24</dd>' in html
    worst = html[html.index('class="worst-moment worst-notices"') :]
    worst = worst[: worst.index("</details>")]
    reason = stored["worst"][0]["plan"]["preemptions"][0]["reason"]
    assert reason in worst  # the arbiter's own words, as the plan page shows them
    words = text(worst)
    assert "VMs that would get notices (2 VMs, 8 GPUs)" in words
    assert "sim-chat-1 n3 4, 5, 6, 7 (4 GPUs) GPUs freed by spot-4" in words
    assert "3 spot 0 16 8 -8 0 no floor: all of it may be reclaimed" in words
    assert "<a " not in worst  # a simulated VM or node is no page to link to


def test_the_comparison_shows_each_difference_before_and_after_and_which_way_it_goes():
    today, edited = run(full_set()), run(full_set(spot_floor=16))
    differences = [
        {"label": d.label, "before": d.before.shown(), "after": d.after.shown()}
        for d in compare(today, edited)
    ]
    context = {
        "result": result_to_dict(today),
        "variant_result": result_to_dict(edited),
        "differences": differences,
        "pool_kinds": KINDS,
    }
    html = render_to_string("plans/simulation_comparison.html", context)
    table = html[html.index('class="table simulation-differences"') : html.index("</table>")]
    rows = re.findall(r'<tr class="difference-row" data-direction="(\w*)">(.*?)</tr>', table, re.S)
    assert [text(row) for _, row in rows] == [
        "spot notices/day 24 → 0 better",
        "chat requests waited too long/day 45672 → 290472 worse",
        "chat requests refused/day 19392 → 143232 worse",
        "spot resumes/day 24 → 0 —",
    ]
    assert [direction for direction, _ in rows] == ["better", "worse", "worse", ""]
    # Each chart of today's run sits next to the same chart of the edited run.
    assert html.count("<svg") == 12
    assert html.index('id="today-notices"') < html.index('id="edited-notices"')
    assert html.index('id="edited-replicas-0"') < html.index('id="today-notices"')
    # Twins share a scale: chat's pool held 12 GPUs today and only 4 (8 pending) when edited,
    # and both charts go up to 15.
    scales = dict(re.findall(r'<svg [^>]*id="([\w-]+)"[^>]*data-max="([\d,.]+)"', html))
    assert scales["today-pool-0"] == scales["edited-pool-0"] == "15"
    assert scales["today-notices"] == scales["edited-notices"]
    # Without stored differences, the figures that differ are found the same.
    del context["differences"]
    again = render_to_string("plans/simulation_comparison.html", context)
    assert text(again[again.index("<table") : again.index("</table>")]) == text(
        html[html.index("<table") : html.index("</table>")]
    )


def test_a_result_with_no_deployments_and_no_notices_renders_without_error():
    start = full_set()
    start = replace(start, deployments=(), vms=tuple(vm for vm in start.vms if vm.pool != "chat"))
    result = run(start, Profile(), deployments={})
    stored = result_to_dict(result)
    html = render_to_string("plans/simulation_result.html", {"result": stored})
    assert html.count("<svg") == 4  # three pools and the notices
    assert "No notice and no resume in this run." in html
    assert "No notices and no queue waits in this run." in html
    compared = render_to_string(
        "plans/simulation_comparison.html", {"result": stored, "variant_result": stored}
    )
    assert "The two runs differ in no figure." in compared


# --- a larger day: three deployments on their own pools, and a spot pool ----------------------

BIG_KINDS = {"chat": "inference", "code": "inference", "embed": "inference", "spot": "spot"}


def big_day():
    nodes = tuple(Node(f"n{n}", 8) for n in range(1, 7))
    vms = [
        running(f"{slug}-1", slug, f"n{n}", (0, 1, 2, 3), -600, deployment=slug)
        for n, slug in enumerate(("chat", "code", "embed"), start=1)
    ]
    vms += [
        running(f"spot-{n}", "spot", f"n{n}", (4, 5, 6, 7), -10 * n, tenant="globex")
        for n in range(1, 7)
    ]
    start = replace(
        full_set(),
        nodes=nodes,
        pools=(
            Pool("chat", "inference", 1),
            Pool("code", "inference", 2),
            Pool("embed", "inference", 3),
            Pool("spot", "spot", 4),
        ),
        vms=tuple(vms),
        deployments=tuple(Deployment(slug, slug, 1) for slug in ("chat", "code", "embed")),
    )
    hours = [(h * 3600.0, 4.0 + 8 * (h % 5 == 2) + (h % 3)) for h in range(24)]
    load = DeploymentLoad(requests=Curve(tuple(hours), "step"), service_seconds=1.0)
    profile = Profile(deployments=dict.fromkeys(("chat", "code", "embed"), load))
    specs = {slug: replace(SLOW_CHAT, pool=slug, tenant=None) for slug in ("chat", "code", "embed")}
    return start, profile, specs


def _in_lines_chart_bars(root, rect) -> bool:
    """Bars behind step lines are named by their columns' tooltips, not their own."""
    return rect.get("data-value") is not None and root.find(f".//{SVG}path") is not None

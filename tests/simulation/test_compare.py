"""Two configurations side by side: the numbers that differ; a result stored as JSON."""

import json
from dataclasses import replace

from gpucap.simulation import compare, simulate
from gpucap.simulation.codec import result_to_dict
from tests.simulation.sets import CHAT, chat_load, full_set

# Chat's replicas serve 8 at once here, so 12 requests/s queue until the new replicas are up.
SLOW_CHAT = replace(CHAT, replica_concurrency=8, max_replicas=3)


def run(start):
    return simulate(
        start,
        chat_load((0, 4), (10, 12), (60, 4)),
        deployments={"chat": SLOW_CHAT},
        notice_seconds=300,
        duration_seconds=2 * 3600,
        startup_seconds=60,
    )


def test_a_floor_that_spares_the_spot_vms_shows_fewer_notices_and_more_requests_turned_away():
    today, edited = run(full_set()), run(full_set(spot_floor=16))
    assert [str(difference) for difference in compare(today, edited)] == [
        "spot notices/day 24 → 0",
        "chat requests waited too long/day 45672 → 290472",
        "chat requests refused/day 19392 → 143232",
        "spot resumes/day 24 → 0",
    ]


def test_a_run_compared_with_itself_differs_in_nothing():
    assert compare(run(full_set()), run(full_set())) == []


def test_the_days_p99_wait_is_the_wait_99_percent_of_requests_stayed_within():
    figures = {figure.key: figure for figure in run(full_set()).figures()}
    assert figures["chat.p99_wait"].shown() == "8.0 s"
    assert figures["chat.most_queued"].value == 64
    assert figures["spot.notices_per_day"].value == 24


def test_a_result_is_stored_as_json_with_its_series_events_and_worst_plans():
    stored = json.loads(json.dumps(result_to_dict(run(full_set()))))
    steps = stored["steps"]
    assert len(steps["at"]) == 120 and steps["at"][11] == "2026-12-02T08:11:00Z"
    assert steps["notices"][11] == 2
    assert steps["pools"]["spot"]["held_gpus"][10:12] == [16, 8]
    assert steps["deployments"]["chat"]["queue"][11] == 64
    assert [e["vm"] for e in stored["events"] if e["kind"] == "notice"] == ["spot-4", "spot-3"]
    worst = stored["worst"][0]
    assert (worst["kind"], worst["step"], worst["plan_step"]) == ("notices", 11, 11)
    assert [p["vm"] for p in worst["plan"]["preemptions"]] == ["spot-4", "spot-3"]
    assert {"key": "spot.notices_per_day", "shown": "24"}.items() <= stored["figures"][4].items()

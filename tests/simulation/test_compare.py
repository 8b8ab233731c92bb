"""Two configurations side by side: the numbers that differ."""

from dataclasses import replace

from gpucap.simulation import compare, simulate
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

"""The calendar of scheduled policies, on its own (no database): weekly windows read on a zone's
wall clock across midnight, the week's end and both daylight-saving changes; entries refused
when they would set one value at once; the policy in force at chosen instants.

Dates of 2026 used below: New York springs forward on Sunday 8 March (02:00 EST -> 03:00 EDT,
07:00 UTC) and falls back on Sunday 1 November (02:00 EDT -> 01:00 EST, 06:00 UTC); Berlin and
London change on Sunday 29 March and Sunday 25 October at 01:00 UTC.
"""

import os
import subprocess
import sys
from datetime import UTC, datetime, time, timedelta
from itertools import pairwise
from pathlib import Path
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucap.schedules.calendar import (
    FLOOR_GPUS,
    MAX_REPLICAS,
    MIN_REPLICAS,
    RANK_ORDER,
    Base,
    Change,
    Entry,
    Override,
    Window,
    boundaries,
    conflicts,
    describe_days,
    effective,
    wall_instant,
    zone_problem,
)

NEW_YORK = "America/New_York"
BERLIN = "Europe/Berlin"
LONDON = "Europe/London"
MON_FRI = range(5)
SAT, SUN = 5, 6
EVERY_DAY = range(7)
HOUR = timedelta(hours=1)
TICK = timedelta(microseconds=1)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def window(days, start: str, end: str, zone: str = NEW_YORK) -> Window:
    return Window(
        days=frozenset(days),
        start=time.fromisoformat(start),
        end=time.fromisoformat(end),
        zone=zone,
    )


def floor(pool: str, gpus: int) -> Change:
    return Change(FLOOR_GPUS, pool, gpus)


# --- Window arithmetic --------------------------------------------------------------------------


def test_a_weekday_window_opens_at_the_same_wall_time_in_winter_and_summer():
    day_shift = window(MON_FRI, "08:00", "20:00")
    # Wednesday 2 December: EST, UTC-5.
    assert day_shift.occurrences(utc(2026, 12, 2, 6), utc(2026, 12, 3, 6)) == [
        (utc(2026, 12, 2, 13), utc(2026, 12, 3, 1))
    ]
    # Wednesday 1 July: EDT, UTC-4.
    assert day_shift.occurrences(utc(2026, 7, 1, 6), utc(2026, 7, 2, 6)) == [
        (utc(2026, 7, 1, 12), utc(2026, 7, 2, 0))
    ]


def test_a_weekday_window_moves_an_hour_earlier_in_utc_over_the_spring_forward_weekend():
    day_shift = window(MON_FRI, "08:00", "20:00")
    # Friday 6 March in EST; nothing on Saturday or on Sunday 8 March, the day of the change;
    # Monday 9 March in EDT.
    assert day_shift.occurrences(utc(2026, 3, 6, 5), utc(2026, 3, 10, 5)) == [
        (utc(2026, 3, 6, 13), utc(2026, 3, 7, 1)),
        (utc(2026, 3, 9, 12), utc(2026, 3, 10, 0)),
    ]


def test_a_weekday_window_moves_an_hour_later_in_utc_over_the_fall_back_weekend():
    day_shift = window(MON_FRI, "08:00", "20:00")
    assert day_shift.occurrences(utc(2026, 10, 30, 4), utc(2026, 11, 3, 5)) == [
        (utc(2026, 10, 30, 12), utc(2026, 10, 31, 0)),
        (utc(2026, 11, 2, 13), utc(2026, 11, 3, 1)),
    ]


def test_a_window_holding_the_change_lasts_an_hour_less_in_spring_and_more_in_autumn():
    mornings = window(EVERY_DAY, "00:00", "12:00")
    assert mornings.occurrences(utc(2026, 3, 8, 5), utc(2026, 3, 8, 6)) == [
        (utc(2026, 3, 8, 5), utc(2026, 3, 8, 16))  # 11 hours
    ]
    assert mornings.occurrences(utc(2026, 11, 1, 4), utc(2026, 11, 1, 5)) == [
        (utc(2026, 11, 1, 4), utc(2026, 11, 1, 17))  # 13 hours
    ]
    # The day shift of those Sundays starts after the change and lasts its 12 hours.
    days = window(EVERY_DAY, "08:00", "20:00")
    assert days.occurrences(utc(2026, 3, 8, 12), utc(2026, 3, 8, 13)) == [
        (utc(2026, 3, 8, 12), utc(2026, 3, 9, 0))
    ]
    assert days.occurrences(utc(2026, 11, 1, 13), utc(2026, 11, 1, 14)) == [
        (utc(2026, 11, 1, 13), utc(2026, 11, 2, 1))
    ]


def test_a_saturday_night_window_lasts_nine_hours_on_the_fall_back_night():
    nights = window([SAT], "22:00", "06:00")
    # Saturday 31 October 22:00 EDT -> Sunday 1 November 06:00 EST.
    assert nights.occurrences(utc(2026, 10, 31), utc(2026, 11, 2)) == [
        (utc(2026, 11, 1, 2), utc(2026, 11, 1, 11))
    ]


def test_a_saturday_night_window_lasts_seven_hours_on_the_spring_forward_night():
    nights = window([SAT], "22:00", "06:00")
    # Saturday 7 March 22:00 EST -> Sunday 8 March 06:00 EDT.
    assert nights.occurrences(utc(2026, 3, 7), utc(2026, 3, 9)) == [
        (utc(2026, 3, 8, 3), utc(2026, 3, 8, 10))
    ]
    # An ordinary Saturday night lasts its eight hours.
    assert nights.occurrences(utc(2026, 3, 14), utc(2026, 3, 16)) == [
        (utc(2026, 3, 15, 2), utc(2026, 3, 15, 10))
    ]


def test_a_window_starting_at_a_skipped_time_starts_at_the_jump():
    # On 8 March New York's clocks go from 01:59:59 EST to 03:00 EDT: 02:30 never shows.
    assert wall_instant(datetime(2026, 3, 8).date(), time(2, 30), ZoneInfo(NEW_YORK)) == utc(
        2026, 3, 8, 7
    )  # 03:00 EDT
    early = window([SUN], "02:30", "04:00")
    assert early.occurrences(utc(2026, 3, 8), utc(2026, 3, 9)) == [
        (utc(2026, 3, 8, 7), utc(2026, 3, 8, 8))  # 03:00-04:00 EDT: one hour, not one and a half
    ]


def test_a_window_ending_at_a_skipped_time_ends_at_the_jump():
    late = window([SAT], "22:00", "02:30")
    assert late.occurrences(utc(2026, 3, 7), utc(2026, 3, 9)) == [
        (utc(2026, 3, 8, 3), utc(2026, 3, 8, 7))
    ]


def test_a_window_the_clock_skips_entirely_is_left_out_that_day_only():
    gap = window([SUN], "02:10", "02:40")
    assert gap.occurrences(utc(2026, 3, 8), utc(2026, 3, 9)) == []
    assert not gap.active_at(utc(2026, 3, 8, 7))
    assert gap.occurrences(utc(2026, 3, 15), utc(2026, 3, 16)) == [
        (utc(2026, 3, 15, 6, 10), utc(2026, 3, 15, 6, 40))
    ]


def test_a_time_the_clock_shows_twice_is_its_first_showing():
    # On 1 November 01:30 shows at 05:30 UTC (EDT) and again at 06:30 UTC (EST).
    assert wall_instant(datetime(2026, 11, 1).date(), time(1, 30), ZoneInfo(NEW_YORK)) == utc(
        2026, 11, 1, 5, 30
    )
    short = window([SUN], "01:30", "01:45")
    assert short.occurrences(utc(2026, 11, 1), utc(2026, 11, 2)) == [
        (utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 5, 45))
    ]
    assert not short.active_at(utc(2026, 11, 1, 6, 35))  # the second 01:35
    # Opening at the first 01:30, a window to 03:00 holds the repeated hour: 2.5 hours.
    across = window([SUN], "01:30", "03:00")
    assert across.occurrences(utc(2026, 11, 1), utc(2026, 11, 2)) == [
        (utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 8))
    ]
    assert across.active_at(utc(2026, 11, 1, 6, 10))  # the second 01:10, after it opened


def test_berlin_changes_on_its_own_dates():
    day_shift = window(MON_FRI, "08:00", "20:00", BERLIN)
    # Berlin springs forward on Sunday 29 March (CET UTC+1 -> CEST UTC+2) ...
    assert day_shift.occurrences(utc(2026, 3, 27), utc(2026, 3, 31)) == [
        (utc(2026, 3, 27, 7), utc(2026, 3, 27, 19)),
        (utc(2026, 3, 30, 6), utc(2026, 3, 30, 18)),
    ]
    # ... and falls back on Sunday 25 October.
    assert day_shift.occurrences(utc(2026, 10, 23), utc(2026, 10, 27)) == [
        (utc(2026, 10, 23, 6), utc(2026, 10, 23, 18)),
        (utc(2026, 10, 26, 7), utc(2026, 10, 26, 19)),
    ]
    nights = window([SAT], "22:00", "06:00", BERLIN)
    spring = nights.occurrences(utc(2026, 3, 28), utc(2026, 3, 30))
    autumn = nights.occurrences(utc(2026, 10, 24), utc(2026, 10, 26))
    assert spring == [(utc(2026, 3, 28, 21), utc(2026, 3, 29, 4))]  # 7 hours
    assert autumn == [(utc(2026, 10, 24, 20), utc(2026, 10, 25, 5))]  # 9 hours
    berlin = ZoneInfo(BERLIN)
    assert wall_instant(datetime(2026, 3, 29).date(), time(2, 30), berlin) == utc(2026, 3, 29, 1)
    assert wall_instant(datetime(2026, 10, 25).date(), time(2, 30), berlin) == utc(
        2026, 10, 25, 0, 30
    )
    # New York's windows are not moved by Berlin's change.
    assert window([SUN], "08:00", "20:00").occurrences(utc(2026, 3, 29), utc(2026, 3, 30)) == [
        (utc(2026, 3, 29, 12), utc(2026, 3, 30, 0))
    ]


def test_a_window_ending_at_its_start_lasts_a_whole_day():
    whole = window([0], "08:00", "08:00")
    assert whole.occurrences(utc(2026, 11, 30), utc(2026, 12, 2)) == [
        (utc(2026, 11, 30, 13), utc(2026, 12, 1, 13))
    ]
    # A whole day is 23 hours on the spring-forward weekend and 25 on the fall-back one.
    saturdays = window([SAT], "12:00", "12:00")
    assert saturdays.occurrences(utc(2026, 3, 7, 12), utc(2026, 3, 7, 18)) == [
        (utc(2026, 3, 7, 17), utc(2026, 3, 8, 16))
    ]
    assert saturdays.occurrences(utc(2026, 10, 31, 12), utc(2026, 10, 31, 18)) == [
        (utc(2026, 10, 31, 16), utc(2026, 11, 1, 17))
    ]


def test_a_sunday_night_window_runs_into_monday_across_the_week_end():
    sunday_night = window([SUN], "22:00", "06:00")
    # Sunday 6 December 22:00 EST -> Monday 7 December 06:00 EST.
    assert sunday_night.occurrences(utc(2026, 12, 7, 5), utc(2026, 12, 7, 6)) == [
        (utc(2026, 12, 7, 3), utc(2026, 12, 7, 11))
    ]
    assert sunday_night.active_at(utc(2026, 12, 7, 10))  # Monday 05:00 in New York
    assert not sunday_night.active_at(utc(2026, 12, 8, 3, 30))  # Monday 22:30: Sunday's only
    assert not sunday_night.active_at(utc(2026, 12, 6, 10))  # Sunday 05:00: Saturday's night


def test_active_at_is_true_from_each_opening_up_to_but_not_at_its_closing():
    cases = [
        (window(MON_FRI, "08:00", "20:00"), utc(2026, 12, 2, 13), utc(2026, 12, 3, 1)),
        (window([SAT], "22:00", "06:00"), utc(2026, 3, 8, 3), utc(2026, 3, 8, 10)),
        (window([SAT], "22:00", "06:00"), utc(2026, 11, 1, 2), utc(2026, 11, 1, 11)),
        (window([SUN], "02:30", "04:00"), utc(2026, 3, 8, 7), utc(2026, 3, 8, 8)),
        (window([SUN], "01:30", "03:00"), utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 8)),
    ]
    for shift, opens, closes in cases:
        assert not shift.active_at(opens - TICK), shift.describe()
        assert shift.active_at(opens), shift.describe()
        assert shift.active_at(opens + TICK), shift.describe()
        assert shift.active_at(closes - TICK), shift.describe()
        assert not shift.active_at(closes), shift.describe()
        assert not shift.active_at(closes + TICK), shift.describe()


def test_a_window_describes_itself_as_it_is_written():
    assert window(MON_FRI, "08:00", "20:00").describe() == "Mon-Fri 08:00-20:00 America/New_York"
    assert describe_days([SAT, SUN]) == "Sat, Sun"
    assert describe_days([0, 1, 2, 4]) == "Mon-Wed, Fri"
    assert describe_days([4, 5, 6, 0]) == "Fri-Mon"  # the week wraps, as "fri-mon" is written
    assert describe_days([SUN, 0]) == "Sun, Mon"
    assert describe_days(EVERY_DAY) == "every day"
    assert window([SUN], "22:00", "06:00:30", BERLIN).describe() == (
        "Sun 22:00-06:00:30 Europe/Berlin"
    )


def test_zones_are_iana_names():
    assert zone_problem(NEW_YORK) is None
    assert zone_problem("UTC") is None
    assert "is not an IANA time zone" in zone_problem("America/Gotham")
    assert "is not an IANA time zone" in zone_problem("+05:00")
    assert zone_problem("") and zone_problem(None) and zone_problem(5)


def test_zones_are_read_from_the_tzdata_package_where_the_system_has_none(tmp_path):
    script = (
        "from datetime import UTC, datetime, time\n"
        "from gpucap.schedules.calendar import Window, zone_problem\n"
        "assert zone_problem('America/New_York') is None\n"
        "shift = Window(frozenset({0}), time(8), time(20), 'America/New_York')\n"
        "since = datetime(2026, 3, 9, tzinfo=UTC)\n"
        "print(shift.occurrences(since, since.replace(day=10))[0][0].isoformat())\n"
    )
    environment = {**os.environ, "PYTHONTZPATH": str(tmp_path)}  # an empty system database
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2026-03-09T12:00:00+00:00"


# --- Boundaries ---------------------------------------------------------------------------------


def test_boundaries_over_a_day_are_each_listed_once_in_order():
    since = utc(2026, 12, 2, 12)  # Wednesday, 07:00 in New York
    entries = [
        Entry("day-shift", window(MON_FRI, "08:00", "20:00"), (floor("chat", 64),)),
        # Opens as the day shift closes: one boundary, not two.
        Entry("evening", window(MON_FRI, "20:00", "23:00"), (floor("batch", 8),)),
        Entry("berlin-night", window(EVERY_DAY, "22:00", "06:00", BERLIN), (floor("eu", 8),)),
    ]
    overrides = [
        Override("peak", (floor("chat", 80),), expires_at=utc(2026, 12, 2, 18)),
        Override(
            "launch",
            (floor("batch", 0),),
            starts_at=utc(2026, 12, 2, 15, 30),
            expires_at=utc(2026, 12, 9),  # beyond the day: its start only
        ),
    ]
    assert boundaries(entries, overrides, since, since + timedelta(hours=24)) == [
        utc(2026, 12, 2, 13),  # 08:00 New York: day shift opens
        utc(2026, 12, 2, 15, 30),  # launch starts
        utc(2026, 12, 2, 18),  # peak expires
        utc(2026, 12, 2, 21),  # 22:00 Berlin: night opens
        utc(2026, 12, 3, 1),  # 20:00 New York: day shift closes, evening opens
        utc(2026, 12, 3, 4),  # 23:00 New York: evening closes
        utc(2026, 12, 3, 5),  # 06:00 Berlin: night closes
    ]


def test_boundaries_take_the_end_of_the_span_but_not_its_start():
    day_shift = [Entry("day-shift", window(MON_FRI, "08:00", "20:00"), (floor("chat", 64),))]
    opens, closes = utc(2026, 12, 2, 13), utc(2026, 12, 3, 1)
    assert boundaries(day_shift, [], opens, closes) == [closes]
    assert boundaries(day_shift, [], opens - TICK, closes - TICK) == [opens]
    assert boundaries(day_shift, [], utc(2026, 12, 5, 6), utc(2026, 12, 7, 6)) == []  # weekend


def test_a_window_open_all_week_has_no_boundary_at_midnight():
    always = [Entry("always", window(EVERY_DAY, "00:00", "00:00"), (floor("chat", 8),))]
    assert boundaries(always, [], utc(2026, 12, 1), utc(2026, 12, 8)) == []
    weekdays = [Entry("weekdays", window(MON_FRI, "00:00", "00:00"), (floor("chat", 8),))]
    assert boundaries(weekdays, [], utc(2026, 11, 30, 12), utc(2026, 12, 8)) == [
        utc(2026, 12, 5, 5),  # Saturday 00:00 in New York: closes
        utc(2026, 12, 7, 5),  # Monday 00:00: opens
    ]


def test_boundaries_over_the_fall_back_night_are_real_instants():
    nights = [Entry("nights", window([SAT], "22:00", "06:00"), (floor("batch", 8),))]
    assert boundaries(nights, [], utc(2026, 10, 31, 12), utc(2026, 11, 1, 12)) == [
        utc(2026, 11, 1, 2),
        utc(2026, 11, 1, 11),
    ]


# --- Conflicts ----------------------------------------------------------------------------------


def test_two_entries_setting_the_same_floor_at_once_are_a_conflict_naming_both():
    since = utc(2026, 12, 1)
    entries = [
        Entry("day-shift", window(MON_FRI, "08:00", "20:00"), (floor("chat", 64),)),
        Entry("lunch-peak", window([2], "12:00", "14:00"), (floor("chat", 80),)),
    ]
    (clash,) = conflicts(entries, since)
    assert (clash.first, clash.second) == ("day-shift", "lunch-peak")
    assert clash.key == (FLOOR_GPUS, "chat")
    assert clash.at == utc(2026, 12, 2, 17)  # Wednesday 12:00 in New York
    words = clash.describe(NEW_YORK)
    assert '"day-shift"' in words and '"lunch-peak"' in words
    assert "pool chat's floor_gpus" in words
    assert "Wed 2026-12-02 12:00 America/New_York" in words
    assert words.endswith(': "day-shift" sets it to 64, "lunch-peak" to 80')


def test_entries_setting_the_same_value_are_a_conflict_even_when_they_agree():
    entries = [
        Entry("a", window(MON_FRI, "08:00", "20:00"), (floor("chat", 64),)),
        Entry("b", window(MON_FRI, "19:00", "21:00"), (floor("chat", 64),)),
    ]
    # Tuesday 19:00 in New York (the Monday evening before lies before the search starts).
    assert [clash.at for clash in conflicts(entries, utc(2026, 12, 1, 12))] == [utc(2026, 12, 2)]


def test_each_shared_value_is_a_conflict_of_its_own():
    entries = [
        Entry(
            "day-shift",
            window(MON_FRI, "08:00", "20:00"),
            (
                floor("chat", 64),
                Change(MIN_REPLICAS, "llama", 8),
                Change(RANK_ORDER, "", ("a", "b")),
            ),
        ),
        Entry(
            "all-week",
            window(EVERY_DAY, "00:00", "00:00"),
            (
                floor("chat", 16),
                Change(MIN_REPLICAS, "llama", 2),
                Change(RANK_ORDER, "", ("b", "a")),
            ),
        ),
    ]
    found = conflicts(entries, utc(2026, 12, 1))
    assert sorted(clash.key for clash in found) == [
        (FLOOR_GPUS, "chat"),
        (MIN_REPLICAS, "llama"),
        (RANK_ORDER, ""),
    ]
    words = {clash.key: clash.describe() for clash in found}
    assert "the rank order" in words[(RANK_ORDER, "")]
    assert '"day-shift" sets it to a > b, "all-week" to b > a' in words[(RANK_ORDER, "")]
    assert "deployment llama's min_replicas" in words[(MIN_REPLICAS, "llama")]


def test_overlapping_entries_setting_different_values_are_fine():
    entries = [
        Entry("day-shift", window(MON_FRI, "08:00", "20:00"), (floor("chat", 64),)),
        Entry("lunch-peak", window([2], "12:00", "14:00"), (floor("batch", 8),)),
        Entry("lunch-replicas", window([2], "12:00", "14:00"), (Change(MAX_REPLICAS, "chat", 8),)),
    ]
    assert conflicts(entries, utc(2026, 12, 1)) == []


def test_entries_setting_one_value_at_different_times_are_fine():
    entries = [
        Entry("day-shift", window(MON_FRI, "08:00", "20:00"), (floor("chat", 64),)),
        # Opens as the day shift closes: windows are half-open, they do not meet.
        Entry("night-shift", window(MON_FRI, "20:00", "08:00"), (floor("chat", 8),)),
        Entry("weekend", window([SAT], "08:00", "08:00"), (floor("chat", 4),)),
    ]
    assert conflicts(entries, utc(2026, 12, 1)) == []


def test_a_sunday_night_entry_conflicts_with_a_monday_morning_one_across_the_week_end():
    entries = [
        Entry("sunday-night", window([SUN], "22:00", "06:00"), (floor("chat", 8),)),
        Entry("monday-early", window([0], "05:00", "07:00"), (floor("chat", 16),)),
    ]
    (clash,) = conflicts(entries, utc(2026, 12, 1))
    assert clash.at == utc(2026, 12, 7, 10)  # Monday 05:00 in New York


def test_entries_in_two_zones_conflict_in_the_weeks_between_their_daylight_saving_changes():
    # 08:00-09:00 in New York and 12:00-13:00 in London are 13:00 and 12:00 UTC in winter and
    # 12:00 and 11:00 UTC in summer: they follow each other. But New York changes its clocks
    # three weeks before London in March and one week after it in autumn: then both are
    # 12:00-13:00 UTC.
    entries = [
        Entry("new-york-standup", window(MON_FRI, "08:00", "09:00"), (floor("chat", 64),)),
        Entry("london-lunch", window(MON_FRI, "12:00", "13:00", LONDON), (floor("chat", 32),)),
    ]
    assert [clash.at for clash in conflicts(entries, utc(2026, 1, 1))] == [utc(2026, 3, 9, 12)]
    assert [clash.at for clash in conflicts(entries, utc(2026, 4, 1))] == [utc(2026, 10, 26, 12)]
    assert [clash.at for clash in conflicts(entries, utc(2026, 11, 2))] == [utc(2027, 3, 15, 12)]
    (clash,) = conflicts(entries, utc(2026, 11, 2))
    assert "Mon 2027-03-15 08:00 America/New_York" in clash.describe(NEW_YORK)
    # An hour later in London they never meet.
    later = Entry("london-late", window(MON_FRI, "14:00", "15:00", LONDON), (floor("chat", 32),))
    assert conflicts([entries[0], later], utc(2026, 1, 1)) == []


# --- The policy in force ------------------------------------------------------------------------

BASE = Base(
    pools={"chat": (1, 4), "batch": (2, 0), "research": (3, 0), "spot": (4, 0)},
    deployments={"llama": (1, 4)},
)
DAY_SHIFT = Entry(
    "day-shift",
    window(MON_FRI, "08:00", "20:00"),
    (floor("chat", 64), Change(MIN_REPLICAS, "llama", 2), Change(MAX_REPLICAS, "llama", 8)),
)


def test_the_policy_in_force_is_the_sets_own_outside_every_window():
    policy = effective(BASE, [DAY_SHIFT], [], utc(2026, 12, 2, 12, 59))  # 07:59 New York
    assert policy.floors == {"chat": 4, "batch": 0, "research": 0, "spot": 0}
    assert policy.ranks == {"chat": 1, "batch": 2, "research": 3, "spot": 4}
    assert policy.replicas == {"llama": (1, 4)}
    assert policy.sources == {}


def test_an_override_wins_over_an_entry_and_an_entry_over_the_sets_own():
    peak = Override(
        "peak",
        (floor("chat", 80),),
        starts_at=utc(2026, 12, 2, 15),
        expires_at=utc(2026, 12, 2, 17),
        set_by="capacity-bot",
    )
    at_open = effective(BASE, [DAY_SHIFT], [peak], utc(2026, 12, 2, 13))
    assert at_open.floors["chat"] == 64
    assert at_open.replicas["llama"] == (2, 8)
    assert at_open.sources[(FLOOR_GPUS, "chat")] == 'entry "day-shift"'

    during = effective(BASE, [DAY_SHIFT], [peak], utc(2026, 12, 2, 15))
    assert during.floors["chat"] == 80
    assert during.sources[(FLOOR_GPUS, "chat")] == 'override "peak" (set by capacity-bot)'
    assert during.replicas["llama"] == (2, 8)  # what the override does not set: the entry's
    assert during.sources[(MIN_REPLICAS, "llama")] == 'entry "day-shift"'

    expired = effective(BASE, [DAY_SHIFT], [peak], utc(2026, 12, 2, 17))  # at its expiry
    assert expired.floors["chat"] == 64

    closed = effective(BASE, [DAY_SHIFT], [peak], utc(2026, 12, 3, 1))  # 20:00 New York
    assert closed.floors["chat"] == 4 and closed.replicas["llama"] == (1, 4)
    assert closed.sources == {}


def test_a_night_entry_is_in_force_through_both_daylight_saving_nights():
    nights = Entry("nights", window([SAT], "22:00", "06:00"), (floor("batch", 8),))

    def batch_floor(at: datetime) -> int:
        return effective(BASE, [nights], [], at).floors["batch"]

    # Fall back: 22:00 EDT Saturday to 06:00 EST Sunday, both 01:30s inside.
    assert batch_floor(utc(2026, 11, 1, 2) - TICK) == 0
    assert batch_floor(utc(2026, 11, 1, 2)) == 8
    assert batch_floor(utc(2026, 11, 1, 5, 30)) == 8  # the first 01:30
    assert batch_floor(utc(2026, 11, 1, 6, 30)) == 8  # the second 01:30
    assert batch_floor(utc(2026, 11, 1, 11) - TICK) == 8
    assert batch_floor(utc(2026, 11, 1, 11)) == 0  # 06:00 EST
    # Spring forward: 22:00 EST Saturday to 06:00 EDT Sunday, over the jump.
    assert batch_floor(utc(2026, 3, 8, 7) - TICK) == 8  # 01:59:59 EST
    assert batch_floor(utc(2026, 3, 8, 7)) == 8  # 03:00 EDT
    assert batch_floor(utc(2026, 3, 8, 10) - TICK) == 8
    assert batch_floor(utc(2026, 3, 8, 10)) == 0  # 06:00 EDT


def test_an_override_without_an_entry_or_a_start_is_in_force_until_it_expires():
    hold = Override("hold", (floor("research", 8),), expires_at=utc(2026, 12, 2, 18))
    assert effective(BASE, [], [hold], utc(2020, 1, 1)).floors["research"] == 8
    assert effective(BASE, [], [hold], utc(2026, 12, 2, 18) - TICK).floors["research"] == 8
    assert effective(BASE, [], [hold], utc(2026, 12, 2, 18)).floors["research"] == 0


def test_of_two_overrides_on_one_value_the_first_by_name_wins():
    # Writes refuse the second; should both be found anyway, the answer is still one value.
    overrides = [
        Override("zeta", (floor("chat", 9),), expires_at=utc(2027, 1, 1)),
        Override("alpha", (floor("chat", 7),), expires_at=utc(2027, 1, 1)),
    ]
    policy = effective(BASE, [DAY_SHIFT], overrides, utc(2026, 12, 2, 13))
    assert policy.floors["chat"] == 7
    assert policy.sources[(FLOOR_GPUS, "chat")] == 'override "alpha"'


def test_a_rank_order_permutes_only_the_named_pools_among_their_own_ranks():
    nights = Entry(
        "nights", window(EVERY_DAY, "20:00", "08:00"), (Change(RANK_ORDER, "", ("spot", "batch")),)
    )
    policy = effective(BASE, [nights], [], utc(2026, 12, 3, 3))
    assert policy.ranks == {"chat": 1, "spot": 2, "research": 3, "batch": 4}
    assert sorted(policy.ranks.values()) == [1, 2, 3, 4]
    assert policy.sources == {(RANK_ORDER, ""): 'entry "nights"'}


def test_changes_naming_what_the_set_no_longer_has_are_ignored():
    stale = Entry(
        "stale",
        window(EVERY_DAY, "00:00", "00:00"),
        (
            floor("gone", 8),
            Change(MIN_REPLICAS, "retired", 3),
            Change(RANK_ORDER, "", ("research", "gone", "chat")),
        ),
    )
    policy = effective(BASE, [stale], [], utc(2026, 12, 2))
    assert "gone" not in policy.floors and "gone" not in policy.ranks
    assert "retired" not in policy.replicas
    assert policy.ranks == {"research": 1, "batch": 2, "chat": 3, "spot": 4}
    assert set(policy.sources) == {(RANK_ORDER, "")}

    lone = Entry("lone", stale.window, (Change(RANK_ORDER, "", ("gone", "chat")),))
    alone = effective(BASE, [lone], [], utc(2026, 12, 2))
    assert alone.ranks == {"chat": 1, "batch": 2, "research": 3, "spot": 4}
    assert alone.sources == {}  # one pool left: nothing to reorder, nothing in force


def test_a_raised_minimum_lifts_a_maximum_below_it():
    # As the deployment's range in force does: an entry may set only the minimum.
    busy = Entry("busy", window(EVERY_DAY, "08:00", "20:00"), (Change(MIN_REPLICAS, "llama", 6),))
    policy = effective(BASE, [busy], [], utc(2026, 12, 2, 15))
    assert policy.replicas["llama"] == (6, 6)
    assert set(policy.sources) == {(MIN_REPLICAS, "llama")}


def test_differences_say_what_changes_in_words():
    before = effective(BASE, [DAY_SHIFT], [], utc(2026, 12, 2, 12))
    nights = Entry(
        "nights", window(EVERY_DAY, "08:00", "20:00"), (Change(RANK_ORDER, "", ("spot", "chat")),)
    )
    after = effective(BASE, [DAY_SHIFT, nights], [], utc(2026, 12, 2, 13))
    assert before.differences(after) == [
        "pool chat floor 4 → 64 GPUs",
        "rank order chat > batch > research > spot → spot > batch > research > chat",
        "deployment llama replicas 1-4 → 2-8",
    ]
    assert after.differences(after) == []


# --- Properties ---------------------------------------------------------------------------------

# Zones with and without daylight saving, of both hemispheres, one changing at midnight
# (Santiago) and one by half an hour (Lord Howe).
ZONES = (
    NEW_YORK,
    BERLIN,
    LONDON,
    "Australia/Sydney",
    "America/Santiago",
    "Australia/Lord_Howe",
    "Asia/Tokyo",
    "UTC",
)


def changes_in_2026(zone: str) -> list[datetime]:
    """The instants at which ``zone``'s offset from UTC changes in 2026 (to the second)."""
    tz = ZoneInfo(zone)
    found = []
    moment = utc(2026, 1, 1)
    while moment < utc(2027, 1, 1):
        following = moment + HOUR
        if moment.astimezone(tz).utcoffset() != following.astimezone(tz).utcoffset():
            low, high = moment, following
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) / 2
                same = middle.astimezone(tz).utcoffset() == low.astimezone(tz).utcoffset()
                low, high = (middle, high) if same else (low, middle)
            found.append(high.replace(microsecond=0))
        moment = following
    return found


ZONE_CHANGES = [(zone, change) for zone in ZONES for change in changes_in_2026(zone)]
PROPERTY = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
clocks = st.builds(time, st.integers(0, 23), st.integers(0, 59))
any_windows = st.builds(
    Window,
    days=st.frozensets(st.integers(0, 6), min_size=1),
    start=clocks,
    end=clocks,
    zone=st.sampled_from(ZONES),
)
any_instants = st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 1, 1)).map(
    lambda moment: moment.replace(tzinfo=UTC)
)


@st.composite
def windows_and_instants(draw) -> tuple[Window, datetime]:
    """Any window at any instant of 2026, or (as often) a window opening or closing near a
    change of its zone's clocks (in a skipped or a repeated hour, or just by it) on a day of the
    change, at an instant near the change."""
    if draw(st.booleans()):
        return draw(any_windows), draw(any_instants)
    zone, change = draw(st.sampled_from(ZONE_CHANGES))
    before = (change - TICK).astimezone(ZoneInfo(zone)).replace(tzinfo=None)

    def near() -> datetime:
        moment = before + timedelta(minutes=draw(st.integers(-90, 90)))
        return moment.replace(second=0, microsecond=0)

    start = near()
    end = near().time() if draw(st.booleans()) else draw(clocks)
    days = draw(st.frozensets(st.integers(0, 6))) | {start.weekday()}
    shift = Window(days=days, start=start.time(), end=end, zone=zone)
    return shift, change + timedelta(seconds=draw(st.integers(-3 * 3600, 3 * 3600)))


def read_on_the_wall(shift: Window, at: datetime) -> bool:
    """Whether ``shift`` is open at ``at``, read off the zone's wall clock alone.

    A window opens when the clock first shows its start on one of its days and closes when it
    first shows its end (on the next day for an end at or before the start). "The clock has
    shown X by ``at``" is "the highest the clock has read up to ``at`` is X or more": that
    takes a skipped time as passed at the jump and a repeated one at its first showing. The
    clock falls back at most an hour, so the highest reading is among the last three hours',
    sampled each minute (windows' times are whole minutes, as are zones' changes)."""
    zone = ZoneInfo(shift.zone)
    highest = max(
        (at - timedelta(minutes=back)).astimezone(zone).replace(tzinfo=None, fold=0)
        for back in range(181)
    )
    for back in range(3):
        day = highest.date() - timedelta(days=back)
        if day.weekday() not in shift.days:
            continue
        opens = datetime.combine(day, shift.start)
        closes = datetime.combine(day + timedelta(days=shift.end <= shift.start), shift.end)
        if opens <= highest < closes:
            return True
    return False


def test_the_properties_see_both_changes_of_each_zone_that_has_them():
    changes = {zone: [] for zone in ZONES}
    for zone, change in ZONE_CHANGES:
        changes[zone].append(change)
    assert changes[NEW_YORK] == [utc(2026, 3, 8, 7), utc(2026, 11, 1, 6)]
    assert changes[BERLIN] == changes[LONDON] == [utc(2026, 3, 29, 1), utc(2026, 10, 25, 1)]
    assert changes["America/Santiago"] == [utc(2026, 4, 5, 3), utc(2026, 9, 6, 4)]
    assert changes["Australia/Lord_Howe"] == [utc(2026, 4, 4, 15), utc(2026, 10, 3, 15, 30)]
    assert len(changes["Australia/Sydney"]) == 2
    assert changes["Asia/Tokyo"] == changes["UTC"] == []
    assert all(zone_problem(zone) is None for zone in ZONES)


@PROPERTY
@given(windows_and_instants())
def test_a_window_is_open_exactly_when_the_wall_clock_says_so(case):
    shift, at = case
    assert shift.active_at(at) == read_on_the_wall(shift, at)


@PROPERTY
@given(windows_and_instants())
def test_occurrences_are_ordered_apart_and_within_an_hour_of_their_wall_length(case):
    shift, at = case
    nominal = datetime.combine(at.date(), shift.end) - datetime.combine(at.date(), shift.start)
    if nominal <= timedelta(0):
        nominal += timedelta(days=1)
    zone = ZoneInfo(shift.zone)
    found = shift.occurrences(at - timedelta(days=3), at + timedelta(days=3))
    for opens, closes in found:
        assert opens < closes
        assert abs((closes - opens) - nominal) <= HOUR
        # It opens on one of its days at its start, or up to an hour later if the clock
        # skipped its start.
        local = opens.astimezone(zone).replace(tzinfo=None)
        assert local.weekday() in shift.days
        assert timedelta(0) <= local - datetime.combine(local.date(), shift.start) <= HOUR
    for (_, closes), (opens, _) in pairwise(found):
        assert closes <= opens


@PROPERTY
@given(st.lists(windows_and_instants(), min_size=1, max_size=3), st.integers(1, 48), st.data())
def test_a_window_opens_or_closes_only_at_a_boundary(cases, hours, data):
    shifts = [shift for shift, _ in cases]
    since = cases[0][1] - timedelta(hours=hours / 2)
    until = since + timedelta(hours=hours)
    entries = [Entry(f"e{i}", shift, ()) for i, shift in enumerate(shifts)]
    found = boundaries(entries, [], since, until)
    assert found == sorted(set(found))
    assert all(since < moment <= until for moment in found)
    at = data.draw(
        st.integers(0, int((until - since).total_seconds())).map(
            lambda seconds: since + timedelta(seconds=seconds)
        )
    )
    last = max((moment for moment in found if moment <= at), default=since)
    for shift in shifts:
        assert shift.active_at(at) == shift.active_at(last)
    # At each, some window opens or closes.
    for moment in found:
        assert any(shift.active_at(moment) != shift.active_at(moment - TICK) for shift in shifts)

"""The written form of a schedule entry or an override (the API's, the fleet file's, the set
page form's): every accepted way of writing it, and every mistake named by its field.

The reader resolves names against the set's pools and deployments as mappings; stand-ins with a
``name`` or a ``slug`` do here, so these tests need no database but the last, which saves an
entry through the service."""

from datetime import time
from types import SimpleNamespace

import pytest
import yaml
from django.core.exceptions import ValidationError

from gpucap.inference.models import MAX_REPLICAS
from gpucap.schedules import calendar, services, spec
from gpucap.schedules.models import ScheduleEntry

POOLS = {name: SimpleNamespace(name=name) for name in ("chat", "batch", "research")}
DEPLOYMENTS = {"llama": SimpleNamespace(slug="llama")}
SET_GPUS = 16


def read_window(**fields) -> tuple[calendar.Window | None, dict[str, str]]:
    data = {"days": "mon-fri", "start": "08:00", "end": "20:00", "time_zone": "America/New_York"}
    data.update(fields)
    problems: dict[str, str] = {}
    return spec.read_window(data, problems), problems


def read_changes(data: dict) -> tuple[list[spec.ChangeSpec], dict[str, str]]:
    problems: dict[str, str] = {}
    changes = spec.read_changes(
        data, pools=POOLS, deployments=DEPLOYMENTS, set_gpus=SET_GPUS, problems=problems
    )
    return changes, problems


# --- The window ---------------------------------------------------------------------------------


def test_a_window_is_read_from_its_written_form():
    window, problems = read_window()
    assert problems == {}
    assert window == calendar.Window(
        days=frozenset(range(5)), start=time(8), end=time(20), zone="America/New_York"
    )


@pytest.mark.parametrize(
    ("written", "days"),
    [
        ("mon-fri", [0, 1, 2, 3, 4]),
        ("Mon-Fri", [0, 1, 2, 3, 4]),
        (" mon - fri ", [0, 1, 2, 3, 4]),
        ("monday-friday", [0, 1, 2, 3, 4]),
        ("sat, sun", [5, 6]),
        ("sun", [6]),
        ("fri-mon", [0, 4, 5, 6]),  # a range wraps over the week's end
        ("mon-wed, fri", [0, 1, 2, 4]),
        ("every day", [0, 1, 2, 3, 4, 5, 6]),
        ("daily", [0, 1, 2, 3, 4, 5, 6]),
        ("all", [0, 1, 2, 3, 4, 5, 6]),
        (["mon", "tue"], [0, 1]),
        (["Monday", "FRIDAY"], [0, 4]),
        ([0, 1], [0, 1]),
        ([6, 6, 0], [0, 6]),
        (["sat", 6, "sunday"], [5, 6]),
    ],
)
def test_days_are_read_in_every_written_form(written, days):
    problems: dict[str, str] = {}
    assert spec.read_days(written, problems) == days
    assert problems == {}


@pytest.mark.parametrize(
    "written",
    [
        None,
        "",
        [],
        [7],
        [-1],
        [True],
        [1.5],
        ["monkey"],  # not Monday: a day is its three letters or its whole name
        ["mo"],
        "weekdays",
        "mon-funday",
        "mon-fri, xyz",
        "mon--fri",
        {"mon": True},
        5,
    ],
)
def test_days_not_written_as_days_are_refused_naming_days(written):
    window, problems = read_window(days=written)
    assert window is None
    assert set(problems) == {"days"}
    assert "days the window starts on" in problems["days"]


@pytest.mark.parametrize(
    ("written", "clock"),
    [
        ("08:00", time(8)),
        ("00:00", time(0)),
        ("23:59", time(23, 59)),
        ("06:00:30", time(6, 0, 30)),
        (time(9, 15), time(9, 15)),
    ],
)
def test_times_of_day_are_read_as_hh_mm(written, clock):
    problems: dict[str, str] = {}
    assert spec.read_clock(written, "start", problems) == clock
    assert problems == {}


@pytest.mark.parametrize(
    "written", ["8:00", "24:00", "08:60", "0800", "08:00pm", "08:00:60", "", None, 800, True]
)
def test_start_and_end_not_written_as_hh_mm_are_refused_each_by_name(written):
    window, problems = read_window(start=written)
    assert window is None
    assert set(problems) == {"start"}
    assert "HH:MM" in problems["start"]
    window, problems = read_window(end=written)
    assert set(problems) == {"end"}


def test_an_unquoted_time_in_yaml_is_refused_with_a_hint_to_quote_it():
    # YAML 1.1 reads 20:00 unquoted as 1200 (base 60); 08:00 stays text.
    data = yaml.safe_load("start: 08:00\nend: 20:00")
    assert data == {"start": "08:00", "end": 1200}
    _, problems = read_window(**data)
    assert set(problems) == {"end"}
    assert 'quote the time ("20:00")' in problems["end"]


@pytest.mark.parametrize("written", ["Europe/Berlin", "Australia/Lord_Howe", "UTC"])
def test_a_time_zone_is_an_iana_name(written):
    window, problems = read_window(time_zone=written)
    assert problems == {}
    assert window.zone == written


@pytest.mark.parametrize(
    "written",
    ["America/Gotham", "america/new_york", "+05:00", "new york", "", None, 5, "../../etc/passwd"],
)
def test_a_time_zone_that_is_not_an_iana_name_is_refused(written):
    window, problems = read_window(time_zone=written)
    assert window is None
    assert set(problems) == {"time_zone"}
    assert "IANA time zone" in problems["time_zone"]


def test_each_mistake_of_a_window_is_named_at_once():
    window, problems = read_window(days="someday", start="8", end="late", time_zone="Mars/Base")
    assert window is None
    assert set(problems) == {"days", "start", "end", "time_zone"}


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("day-shift", None),
        ("a", None),
        ("night-2", None),
        ("Day-Shift", spec.NAME_RULE),
        ("-day", spec.NAME_RULE),
        ("day-", spec.NAME_RULE),
        ("day shift", spec.NAME_RULE),
        ("x" * 65, spec.NAME_RULE),
        ("", spec.NAME_RULE),
        (None, spec.NAME_RULE),
    ],
)
def test_names_are_lowercase_words_joined_by_hyphens(name, problem):
    assert spec.name_problem(name) == problem


# --- What it sets -------------------------------------------------------------------------------


def test_changes_are_read_and_resolved_against_the_sets_pools_and_deployments():
    changes, problems = read_changes(
        {
            "pools": {"chat": {"floor_gpus": 8}},
            "rank_order": ["research", "chat"],
            "deployments": {"llama": {"min_replicas": 2, "max_replicas": 6}},
        }
    )
    assert problems == {}
    assert spec.as_calendar_changes(changes) == (
        calendar.Change(calendar.FLOOR_GPUS, "chat", 8),
        calendar.Change(calendar.MIN_REPLICAS, "llama", 2),
        calendar.Change(calendar.MAX_REPLICAS, "llama", 6),
        calendar.Change(calendar.RANK_ORDER, "", ("research", "chat")),
    )
    ranked = [(change.pool.name, change.position) for change in changes if change.position]
    assert ranked == [("research", 1), ("chat", 2)]


def test_the_written_form_reads_back_to_the_same_changes():
    data = {
        "pools": {"chat": {"floor_gpus": 8}, "batch": {"floor_gpus": 0}},
        "rank_order": ["batch", "research", "chat"],
        "deployments": {"llama": {"max_replicas": 6}},
    }
    changes, _ = read_changes(data)
    again = spec.written(list(spec.as_calendar_changes(changes)))
    assert again == data
    assert spec.as_calendar_changes(read_changes(again)[0]) == spec.as_calendar_changes(changes)


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"pools": {"gpt": {"floor_gpus": 8}}}, "pools.gpt", "is not a pool of this capacity set"),
        ({"pools": {"chat": {"floor_gpus": -1}}}, "pools.chat.floor_gpus", "from 0 to 16"),
        ({"pools": {"chat": {"floor_gpus": 17}}}, "pools.chat.floor_gpus", "from 0 to 16"),
        ({"pools": {"chat": {"floor_gpus": "8"}}}, "pools.chat.floor_gpus", "whole number"),
        ({"pools": {"chat": {"floor_gpus": True}}}, "pools.chat.floor_gpus", "whole number"),
        ({"pools": {"chat": {"floor_gpus": 2.5}}}, "pools.chat.floor_gpus", "whole number"),
        ({"pools": {"chat": {"rank": 1}}}, "pools.chat.rank", "cannot be scheduled"),
        ({"pools": {"chat": {}}}, "pools.chat", "must set one or more of floor_gpus"),
        ({"pools": {"chat": 8}}, "pools.chat", "must set one or more of floor_gpus"),
        ({"pools": ["chat"]}, "pools", "mapping"),
        (
            {"deployments": {"mistral": {"min_replicas": 1}}},
            "deployments.mistral",
            "is not an inference deployment of this capacity set",
        ),
        (
            {"deployments": {"llama": {"min_replicas": 8, "max_replicas": 4}}},
            "deployments.llama.min_replicas",
            "min_replicas 8 is above max_replicas 4",
        ),
        (
            {"deployments": {"llama": {"max_replicas": MAX_REPLICAS + 1}}},
            "deployments.llama.max_replicas",
            f"from 0 to {MAX_REPLICAS}",
        ),
        (
            {"deployments": {"llama": {"replicas": 4}}},
            "deployments.llama.replicas",
            "cannot be scheduled",
        ),
        ({"deployments": "llama"}, "deployments", "mapping"),
        ({"rank_order": ["chat", "gpt"]}, "rank_order", "gpt: not pools of this capacity set"),
        ({"rank_order": ["chat", "chat"]}, "rank_order", "names a pool twice"),
        ({"rank_order": ["chat"]}, "rank_order", "two or more"),
        ({"rank_order": []}, "rank_order", "two or more"),
        ({"rank_order": "chat, batch"}, "rank_order", "two or more"),
        ({"rank_order": ["chat", 2]}, "rank_order", "two or more"),
        ({}, "non_field_errors", "sets nothing"),
        ({"pools": {}, "deployments": {}}, "non_field_errors", "sets nothing"),
    ],
)
def test_each_mistake_in_what_is_set_is_named_by_its_field(data, field, words):
    _, problems = read_changes(data)
    assert field in problems, problems
    assert words in problems[field]


def test_the_mistakes_of_several_fields_are_named_together():
    _, problems = read_changes(
        {
            "pools": {"gpt": {"floor_gpus": 1}, "chat": {"floor_gpus": 99}},
            "deployments": {"llama": {"min_replicas": 5, "max_replicas": 2}},
            "rank_order": ["chat"],
        }
    )
    assert set(problems) == {
        "pools.gpt",
        "pools.chat.floor_gpus",
        "deployments.llama.min_replicas",
        "rank_order",
    }


def test_a_floor_at_the_sets_size_and_a_range_at_its_limits_are_accepted():
    changes, problems = read_changes(
        {
            "pools": {"chat": {"floor_gpus": SET_GPUS}, "batch": {"floor_gpus": 0}},
            "deployments": {"llama": {"min_replicas": 0, "max_replicas": MAX_REPLICAS}},
        }
    )
    assert problems == {}
    assert len(changes) == 4


# --- Through the service ------------------------------------------------------------------------


@pytest.mark.django_db
def test_saving_an_entry_names_each_bad_field_and_writes_nothing(fleet_east, operator):
    h100 = fleet_east["sets"]["h100-east"]
    with pytest.raises(ValidationError) as refused:
        services.schedule_entry_save(
            capacity_set=h100,
            actor=operator,
            data={
                "name": "Day Shift",
                "days": "monday-funday",
                "start": "8am",
                "end": 1200,
                "time_zone": "America/Gotham",
                "pools": {"h100-nowhere": {"floor_gpus": 1}, "h100-spot": {"floor_gpus": -2}},
                "rank_order": ["h100-spot"],
                "colour": "blue",
            },
        )
    assert set(refused.value.message_dict) == {
        "name",
        "days",
        "start",
        "end",
        "time_zone",
        "pools.h100-nowhere",
        "pools.h100-spot.floor_gpus",
        "rank_order",
        "colour",
    }
    assert not ScheduleEntry.objects.exists()

"""Reading a load profile: every bad field named, nonsense refused."""

import json

import pytest

from gpucap.simulation import (
    Curve,
    ProfileError,
    curve_from_csv,
    profile_from_dict,
    profile_from_json,
)


def problems_of(data) -> dict[str, str]:
    with pytest.raises(ProfileError) as refused:
        profile_from_json(json.dumps(data) if not isinstance(data, str) else data)
    return refused.value.problems


def test_a_linear_curve_moves_in_a_straight_line_and_holds_its_ends():
    curve = Curve(((60.0, 10.0), (120.0, 40.0)))
    assert [curve.at(s) for s in (0, 60, 90, 120, 500)] == [10.0, 10.0, 25.0, 40.0, 40.0]


def test_a_step_curve_holds_each_rate_until_the_next_point():
    curve = Curve(((0.0, 10.0), (120.0, 40.0)), "step")
    assert [curve.at(s) for s in (0, 119.9, 120)] == [10.0, 10.0, 40.0]


def test_a_profile_reads_back_what_it_writes():
    profile = profile_from_dict(
        {
            "deployments": {"chat": {"points": [[0, 4], [3600, 12]], "service_seconds": 0.5}},
            "pools": {
                "spot": {
                    "shape": "step",
                    "points": [[0, 6]],
                    "gpus_per_vm": 8,
                    "duration_seconds": 7200,
                    "tenant": "acme",
                }
            },
        }
    )
    assert profile.deployments["chat"].requests.at(1800) == 8.0
    assert profile.pools["spot"].gpus_per_vm == 8
    assert profile_from_dict(profile.to_dict()) == profile


def test_every_bad_field_is_named_with_its_place():
    assert problems_of(
        {
            "deployments": {
                "chat": {
                    "shape": "cubic",
                    "points": [[0, 1], [10, -2], [20, 3], [30]],
                    "service_seconds": 0,
                    "colour": "red",
                }
            },
            "pools": {"spot": {"points": [], "gpus_per_vm": 9, "duration_seconds": "5"}},
            "nodes": [],
        }
    ) == {
        "nodes": "is not a field of a profile here",
        "deployments.chat.shape": "must be one of linear, step; got 'cubic'",
        "deployments.chat.points[1]": "rate must be 0 or more, got -2",
        "deployments.chat.points[3]": "must be a pair [seconds_from_start, rate]",
        "deployments.chat.service_seconds": "must be more than 0, got 0",
        "deployments.chat.colour": "is not a field of a profile here",
        "pools.spot.points": "must have at least one point",
        "pools.spot.gpus_per_vm": "must be 8 or less, got 9",
        "pools.spot.duration_seconds": "must be a number, got '5'",
    }


def test_unsorted_times_are_refused_at_the_point_that_goes_back():
    problems = problems_of(
        {"deployments": {"chat": {"points": [[0, 1], [300, 2], [120, 3]], "service_seconds": 1}}}
    )
    assert problems == {
        "deployments.chat.points[2]": (
            "time 120 is not after the point before it (300): times must increase"
        )
    }


def test_text_that_is_no_json_object_is_refused():
    assert list(problems_of("not json")) == ["profile"]
    assert problems_of([1]) == {"profile": "must be an object, got [1]"}


def test_a_curve_reads_from_csv_with_or_without_a_header():
    assert curve_from_csv("seconds,rps\n0,4\n3600,12\n").points == ((0.0, 4.0), (3600.0, 12.0))
    assert curve_from_csv("0,4\n", shape="step").shape == "step"


def test_a_csv_curve_names_its_bad_rows():
    with pytest.raises(ProfileError) as refused:
        curve_from_csv("0,4\n60,-1\n30,2,9\n", where="deployments.chat.points")
    assert refused.value.problems == {
        "deployments.chat.points[1]": "rate must be a number, 0 or more; got '-1'",
        "deployments.chat.points[2]": "must be two columns, seconds_from_start,rate; got 3",
    }
    with pytest.raises(ProfileError) as refused:
        curve_from_csv("0,4\n60,1\n30,2\n")
    assert list(refused.value.problems) == ["points[2]"]

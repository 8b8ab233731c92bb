"""The one rule on text and JSON that every way in shares (gpucap.inputs): no database."""

import json

import pytest

from gpucap import inputs


@pytest.mark.parametrize("value", ["a\x00b", "\x1b[31m", "x\x7f\x01"])
def test_control_characters_are_refused_in_any_text(value):
    assert "control character" in inputs.text_problem(value)


def test_free_text_keeps_tabs_and_line_breaks_and_bidi_text():
    assert inputs.text_problem("#cloud-config\n\truncmd: []\r\n") is None
    assert inputs.text_problem("مرحبا \u202bمختلط\u202c") is None


def test_a_lone_surrogate_is_refused():
    assert "lone surrogate" in inputs.text_problem("admin\ud800")


@pytest.mark.parametrize("char", ["\u202a", "\u202e", "\u2066", "\u2069", "\n", "\t"])
def test_names_refuse_bidi_controls_and_line_breaks(char):
    assert inputs.text_problem(f"train{char}01", name=True) is not None


def test_data_problem_names_the_field_path():
    assert inputs.data_problem({"labels": {"rack": "a\x00"}}) == (
        "labels.rack",
        "contains the control character U+0000",
    )
    assert inputs.data_problem({"tenants": ["acme", "glo\u202ebex"]})[0] == "tenants[1]"
    assert inputs.data_problem({"description": "\u202eok"}) is None


def test_json_nested_50000_deep_is_refused_not_a_crash():
    with pytest.raises(inputs.JsonTooDeep):
        inputs.json_loads("[" * 50_000 + "]" * 50_000)
    with pytest.raises(ValueError, match="nested more than 32"):
        inputs.json_loads(json.dumps(_nested(40)))
    assert inputs.json_loads(json.dumps(_nested(20))) == _nested(20)


def _nested(depth: int):
    value = 1
    for _ in range(depth):
        value = {"a": [value]} if depth % 2 else [value]
    return value

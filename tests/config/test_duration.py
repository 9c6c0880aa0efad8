"""Durations: every accepted spelling, every rejected one, and the shortest way to print one."""

from __future__ import annotations

import json
import math
import re

import pytest

from nvtrain.config import format_duration, parse_duration
from nvtrain.config.duration import DURATION_HINT
from nvtrain.config.reference import schema_json

NOT_A_DURATION = f"is not a duration; {DURATION_HINT}"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90.0),
        (1, 1.0),
        (0.25, 0.25),
        (1.5, 1.5),
        (86400 * 365, 31536000.0),
        ("90s", 90.0),
        ("15m", 900.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("250ms", 0.25),
        ("1h30m", 5400.0),
        ("1m30s", 90.0),
        ("1d2h3m4s", 93784.0),
        ("1s500ms", 1.5),
        ("1.5s", 1.5),
        ("1.5h", 5400.0),
        ("0.5m", 30.0),
        ("010s", 10.0),
        (" 90s ", 90.0),
        ("1h 30m", 5400.0),
        ("  1m  30s  ", 90.0),
    ],
)
def test_accepted(value: object, seconds: float) -> None:
    result = parse_duration(value)
    assert result == seconds
    assert type(result) is float


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, NOT_A_DURATION),
        (False, NOT_A_DURATION),
        (None, NOT_A_DURATION),
        ([90], NOT_A_DURATION),
        ({"s": 90}, NOT_A_DURATION),
        ("", NOT_A_DURATION),
        ("   ", NOT_A_DURATION),
        ("m", NOT_A_DURATION),
        ("s", NOT_A_DURATION),
        ("5x", NOT_A_DURATION),
        ("90", NOT_A_DURATION),
        ("1h30", NOT_A_DURATION),
        ("90 sec", NOT_A_DURATION),
        ("90S", NOT_A_DURATION),
        ("1H", NOT_A_DURATION),
        ("-5s", NOT_A_DURATION),
        ("+5s", NOT_A_DURATION),
        (".5s", NOT_A_DURATION),
        ("5.s", NOT_A_DURATION),
        ("1e3s", NOT_A_DURATION),
        ("1,5s", NOT_A_DURATION),
        ("inf", NOT_A_DURATION),
        ("nan", NOT_A_DURATION),
        (0, "must be longer than zero"),
        (0.0, "must be longer than zero"),
        (-0.0, "must be longer than zero"),
        (-1, "must be longer than zero"),
        (-0.5, "must be longer than zero"),
        ("0s", "must be longer than zero"),
        ("0ms", "must be longer than zero"),
        ("0h0m", "must be longer than zero"),
        (math.nan, "must be a finite duration"),
        (math.inf, "must be a finite duration"),
        (-math.inf, "must be a finite duration"),
        ("9" * 400 + "s", "must be a finite duration"),
    ],
)
def test_rejected(value: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(value)
    assert str(info.value).split("; ")[0] == message.split("; ")[0]


def test_rule_and_fix_are_separated_by_a_semicolon() -> None:
    """The loader splits a ValueError's message at '; ' into the finding's rule and fix."""
    with pytest.raises(ValueError) as info:
        parse_duration("5x")
    rule, _, fix = str(info.value).partition("; ")
    assert rule == "is not a duration"
    assert fix == DURATION_HINT


def test_an_integer_too_large_for_a_float_is_a_value_error() -> None:
    # tomllib reads integers of any size; float() of one this large raises OverflowError, which
    # pydantic does not turn into a validation error, so validation crashes.
    with pytest.raises(ValueError, match="finite"):
        parse_duration(10**400)


def test_digits_separated_by_a_space_are_not_merged() -> None:
    # "1 5s" is not 15 seconds; the JSON Schema's pattern rejects it too.
    with pytest.raises(ValueError):
        parse_duration("1 5s")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.001, "1ms"),
        (0.25, "250ms"),
        (0.5, "500ms"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (59.0, "59s"),
        (60.0, "1m"),
        (90.0, "1m30s"),
        (3600.0, "1h"),
        (5400.0, "1h30m"),
        (86400.0, "1d"),
        (90061.0, "1d1h1m1s"),
        (172800.0, "2d"),
        (600.0, "10m"),
    ],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("seconds", [100000.5, 1234567.5, 12345.678, 36000000.25])
def test_format_keeps_every_digit_and_can_be_parsed(seconds: float) -> None:
    # format_duration uses "%g" (6 significant digits): 100000.5 prints as "100000s" or
    # "100001s" and 1234567.5 as "1.23457e+06s", which parse_duration rejects.
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=1e-12)


def _schema_pattern() -> re.Pattern[str]:
    schema = json.loads(schema_json())
    duration = schema["$defs"]["Heartbeat"]["properties"]["monitor_interval"]
    (string_branch,) = [b for b in duration["anyOf"] if b.get("type") == "string"]
    return re.compile(string_branch["pattern"])


def test_schema_describes_durations() -> None:
    schema = json.loads(schema_json())
    duration = schema["$defs"]["Heartbeat"]["properties"]["monitor_interval"]
    assert {"type": "number", "exclusiveMinimum": 0} in duration["anyOf"]
    assert duration["default"] == 5.0


@pytest.mark.parametrize("text", ["90s", "1h30m", "250ms", " 1m 30s ", "1.5s", "1h 30m", "1d"])
def test_schema_pattern_accepts_what_the_parser_accepts(text: str) -> None:
    assert _schema_pattern().search(text)
    parse_duration(text)


@pytest.mark.parametrize("text", ["5x", "", "m", "1h30", "-5s", ".5s", "1e3s", "90 sec"])
def test_schema_pattern_rejects_what_the_parser_rejects(text: str) -> None:
    assert not _schema_pattern().search(text)
    with pytest.raises(ValueError):
        parse_duration(text)


def test_schema_pattern_and_parser_agree_on_tabs() -> None:
    # The schema allows any whitespace between parts; the parser only removes spaces.
    text = "1h\t30m"
    accepted_by_schema = bool(_schema_pattern().search(text))
    try:
        parse_duration(text)
        accepted_by_parser = True
    except ValueError:
        accepted_by_parser = False
    assert accepted_by_schema == accepted_by_parser

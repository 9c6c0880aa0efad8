"""Durations in policy and timings files: ``"90s"``, ``"15m"``, ``"1h30m"``, ``"250ms"`` or seconds."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema

__all__ = ["DURATION_HINT", "Duration", "format_duration", "is_duration_field", "parse_duration"]

DURATION_HINT = 'write a number of seconds or a string such as "90s", "15m", "1h30m" or "250ms"'

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")


def parse_duration(value: object) -> float:
    """Return ``value`` in seconds. Raises ``ValueError`` (with a fix) for anything else.

    >>> parse_duration("1h30m"), parse_duration(90), parse_duration("250ms")
    (5400.0, 90.0, 0.25)
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"is not a duration; {DURATION_HINT}")
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not _WHOLE.fullmatch(text):
            raise ValueError(f"is not a duration; {DURATION_HINT}")
        seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError("must be a finite duration")
    if seconds <= 0:
        raise ValueError("must be longer than zero")
    return seconds


def _validate(value: Any) -> float:
    return parse_duration(value)


_TO_SECONDS = BeforeValidator(_validate)

Duration = Annotated[
    float,
    _TO_SECONDS,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string", "pattern": r"^\s*(\d+(\.\d+)?\s*(ms|s|m|h|d)\s*)+$"},
            ],
            "description": "seconds, or a string with units: 90s, 15m, 1h30m, 250ms",
        }
    ),
]
"""A duration; validated models hold plain float seconds."""


def is_duration_field(metadata: list[Any]) -> bool:
    """Whether a pydantic field with this ``metadata`` is a ``Duration``."""
    return any(m is _TO_SECONDS for m in metadata)


def format_duration(seconds: float) -> str:
    """The shortest unit string for ``seconds``: 5400 -> ``"1h30m"``, 0.25 -> ``"250ms"``."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole = int(seconds)
    if whole != seconds:
        return f"{seconds:g}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)

"""Durations in policy and timings files: ``"90s"``, ``"15m"``, ``"1h30m"``, ``"250ms"`` or seconds."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema

__all__ = ["DURATION_HINT", "PATTERN", "Duration", "format_duration", "is_duration_field", "parse_duration"]

DURATION_HINT = 'write a number of seconds or a string such as "90s", "15m", "1h30m" or "250ms"'

_UNITS = ("d", "h", "m", "s", "ms")
_SECONDS = {
    "d": Decimal(86400),
    "h": Decimal(3600),
    "m": Decimal(60),
    "s": Decimal(1),
    "ms": Decimal("0.001"),
}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)[ \t]*(ms|s|m|h|d)[ \t]*")
PATTERN = r"^[ \t]*([0-9]+(\.[0-9]+)?[ \t]*(ms|s|m|h|d)[ \t]*)+$"
"""The string form, also published in the JSON Schema."""


def _parse_text(text: str) -> Decimal:
    if not re.fullmatch(PATTERN, text):
        raise ValueError(f"is not a duration; {DURATION_HINT}")
    total = Decimal(0)
    last = -1
    for number, unit in _PART.findall(text):
        rank = _UNITS.index(unit)
        if rank <= last:
            raise ValueError(f"is not a duration: write each unit once, largest first; {DURATION_HINT}")
        last = rank
        total += Decimal(number) * _SECONDS[unit]
    return total


def parse_duration(value: object) -> float:
    """Return ``value`` in seconds. Raises ``ValueError`` (with a fix) for anything else.

    >>> parse_duration("1h30m"), parse_duration(90), parse_duration("250ms")
    (5400.0, 90.0, 0.25)
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"is not a duration; {DURATION_HINT}")
    try:
        seconds = float(_parse_text(value)) if isinstance(value, str) else float(value)
    except OverflowError:
        raise ValueError(f"must be a finite duration (this number is too large); {DURATION_HINT}") from None
    if not math.isfinite(seconds):
        raise ValueError(f"must be a finite duration; {DURATION_HINT}")
    if seconds <= 0:
        raise ValueError(f"must be longer than zero; {DURATION_HINT}")
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
                {"type": "string", "pattern": PATTERN},
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
    """The shortest exact unit string for ``seconds``: 5400 -> ``"1h30m"``, 0.25 -> ``"250ms"``.

    ``parse_duration(format_duration(x)) == x`` for every positive finite ``x``.
    """
    exact = Decimal(repr(float(seconds)))
    if exact < 1:
        return f"{_plain(exact * 1000)}ms"
    if exact != exact.to_integral_value():
        return f"{_plain(exact)}s"
    whole = int(exact)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def _plain(number: Decimal) -> str:
    text = format(number.normalize(), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text

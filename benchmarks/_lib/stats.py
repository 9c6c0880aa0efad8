"""Medians, percentiles, ratios and how the scripts print numbers."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence


def median(values: Iterable[float | None], digits: int | None = None) -> float | None:
    """The median of the values that are not None (rounded to ``digits`` if given); None if
    there are none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    found = statistics.median(present)
    return found if digits is None else round(found, digits)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (with few samples, p95 is the maximum)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def dist(values: Sequence[float]) -> dict[str, float]:
    """Median, p95 (the ``round(0.95 n)``-th smallest) and maximum; {} for no values."""
    ordered = sorted(values)
    if not ordered:
        return {}
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {"median": statistics.median(ordered), "p95": p95, "max": ordered[-1]}


def ratio(a: float | None, b: float | None, digits: int | None = None) -> float | None:
    """``a / b``, or None when either is missing or ``b`` is 0."""
    if a is None or not b:
        return None
    return a / b if digits is None else round(a / b, digits)


def fmt(value: float | None, digits: int = 2, missing: str = "–") -> str:
    """``value`` with ``digits`` decimals, ``missing`` for None."""
    return missing if value is None else f"{value:.{digits}f}"


def span(values: Sequence[float], digits: int = 2, dash: str = "–") -> str:
    """``median (min–max)`` (``dash`` between min and max), or "–" for no values."""
    if not values:
        return "–"
    low, high = fmt(min(values), digits), fmt(max(values), digits)
    return f"{fmt(statistics.median(values), digits)} ({low}{dash}{high})"

"""Steps: the stretches of training between recoveries, and the step times the workers logged."""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from collections.abc import Sequence

from nvtrain.events.records import (
    CheckpointBegin,
    CheckpointRestored,
    CheckpointStaged,
    Event,
    FaultInjected,
    Step,
)
from nvtrain.runlog.kinds import duration

__all__ = ["Stretch", "find_stretch", "logged_step_times"]


@dataclasses.dataclass(frozen=True, slots=True)
class Stretch:
    """The events between two recoveries' first completed steps: one attempt, every rank merged.
    Times are unix times."""

    first_step: float | None
    """Its earliest logged step; None when none was logged."""
    resumed: int
    """The step it resumed after: its first completed step less one, else the step its last
    load restored, else 0."""
    points: tuple[tuple[float, int], ...]
    """Logged steps, by step: (median time over ranks, step); the step an injected fault fired
    at counts when it was not logged."""
    intervals: tuple[tuple[int, int, float], ...]
    """(after step, to step, seconds per step) between two points, less the saves that blocked
    the loop in between."""


def find_stretch(part: Sequence[Event]) -> Stretch:
    """The stretch made of ``part`` (oldest first)."""
    times: dict[int, list[float]] = {}
    blocked: dict[int, float] = {}
    faults: dict[int, float] = {}
    firsts: list[int] = []
    restored: CheckpointRestored | None = None
    first_step: float | None = None
    for e in part:
        if isinstance(e, Step):
            if first_step is None:
                first_step = e.ts
            if e.step is not None:
                times.setdefault(e.step, []).append(e.ts)
                if e.first_of_attempt:
                    firsts.append(e.step)
        elif isinstance(e, CheckpointStaged):
            if e.step is not None:
                blocked[e.step] = max(blocked.get(e.step, 0.0), e.blocked_s or 0.0)
        elif isinstance(e, FaultInjected):
            if e.step is not None:
                faults.setdefault(e.step, e.ts)
        elif isinstance(e, CheckpointRestored):
            restored = e
    for step, at in faults.items():
        times.setdefault(step, [at])
    points = sorted(((statistics.median(stamps), step) for step, stamps in times.items()), key=lambda p: p[1])
    return Stretch(first_step, _resumed(firsts, restored), tuple(points), _intervals(points, blocked))


def _resumed(firsts: list[int], restored: CheckpointRestored | None) -> int:
    """``Stretch.resumed``: before the first completed step of an attempt (``firsts``), else
    the step the last load restored, else 0."""
    if firsts:
        return min(firsts) - 1
    return (restored.step or 0) if restored is not None else 0


def _intervals(
    points: list[tuple[float, int]], blocked: dict[int, float]
) -> tuple[tuple[int, int, float], ...]:
    """``Stretch.intervals`` between the ``points`` (by step), less the seconds each save in
    between blocked the loop (``blocked``: by step)."""
    saved = sorted(blocked)
    intervals = []
    for (ta, sa), (tb, sb) in zip(points, points[1:], strict=False):
        if tb < ta:
            continue
        stall = sum(blocked[x] for x in saved[bisect.bisect_left(saved, sa) : bisect.bisect_left(saved, sb)])
        intervals.append((sa, sb, max(0.0, tb - ta - stall) / (sb - sa)))
    return tuple(intervals)


def logged_step_times(events: Sequence[Event]) -> tuple[float, ...]:
    """Logged ``step_s`` of one step each, leaving out the step right after a save (its time
    includes that save's blocking)."""
    saved = {(e.pid, e.step) for e in events if isinstance(e, CheckpointBegin) and e.step is not None}
    return tuple(
        took
        for e in events
        if isinstance(e, Step)
        and (took := duration(e.step_s)) is not None
        and e.step is not None
        and (e.pid, e.step - 1) not in saved
    )

"""Small readers over the events of a run (dicts as ``read_events`` returns them).

Used by ``model``; nothing here knows the report's dataclasses.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from typing import Any

from nvtrain.events import integer, number

__all__ = [
    "WORKER_EVENTS",
    "as_float",
    "as_int",
    "cause_of",
    "commit_times",
    "count_ranks",
    "exit_code_of",
    "is_fault",
    "is_restart",
    "last_worker_ts",
    "latest",
    "repeated_starts",
    "restart_layers",
    "resume_step",
    "split_at",
    "step_marks",
    "ts",
]

FAULTS = ("fault_injected", "hang_detected", "worker_failed", "signal", "launcher_exit")
"""Events that record a fault (``launcher_exit`` only with a non-zero exit code)."""

WORKER_EVENTS = frozenset(
    {
        "worker_start",
        "attempt_start",
        "step",
        "checkpoint_begin",
        "checkpoint_staged",
        "checkpoint_committed",
        "checkpoint_already_committed",
        "checkpoint_restored",
        "checkpoint_settled",
        "checkpoint_partial",
        "checkpoint_corrupt",
        "checkpoint_rejected",
        "checkpoint_failed",
        "fault_injected",
        "restart_end",
    }
)


as_int = integer
"""An integer field's value; None when it is not one (``nvtrain.events.integer``)."""
as_float = number
"""A numeric field's value as a float; None when it is not a finite number (``nvtrain.events.number``)."""


def ts(event: dict[str, Any]) -> float:
    return float(event["ts"])


def latest(events: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((e for e in reversed(events) if e.get("event") == name), None)


def repeated_starts(events: Sequence[dict[str, Any]]) -> set[int]:
    """``launcher_start`` events of a node that had started before: the pod was restarted."""
    seen: set[object] = set()
    repeats = set()
    for e in events:
        if e.get("event") == "launcher_start":
            node = e.get("node", e.get("host"))
            if node in seen:
                repeats.add(id(e))
            seen.add(node)
    return repeats


def is_fault(e: dict[str, Any]) -> bool:
    name = e.get("event")
    if name == "launcher_exit":
        return as_int(e.get("exit_code")) not in (0, None)
    return name in FAULTS


def is_restart(e: dict[str, Any], repeats: set[int]) -> bool:
    name = e.get("event")
    return name in ("restart_begin", "relaunch") or (name == "launcher_start" and id(e) in repeats)


def split_at(events: Sequence[dict[str, Any]], bounds: Sequence[float]) -> list[list[dict[str, Any]]]:
    """The events between two recoveries' first completed steps."""
    parts: list[list[dict[str, Any]]] = [[] for _ in range(len(bounds) + 1)]
    for e in events:
        parts[bisect.bisect_right(bounds, ts(e))].append(e)
    return parts


def last_worker_ts(events: Sequence[dict[str, Any]]) -> float:
    for e in reversed(events):
        name = e.get("event")
        if name in WORKER_EVENTS or (name == "restart_begin" and e.get("layer") == "in_process"):
            return ts(e)
    return ts(events[-1]) if events else 0.0


def resume_step(part: Sequence[dict[str, Any]]) -> int:
    """The step a stretch resumed after: its first completed step less one."""
    firsts = [
        s
        for e in part
        if e.get("event") == "step"
        and "step_s" in e
        and e["step_s"] is None
        and (s := as_int(e.get("step"))) is not None
    ]
    if firsts:
        return min(firsts) - 1
    restored = latest(part, "checkpoint_restored")
    return (as_int(restored.get("step")) or 0) if restored else 0


def step_marks(
    part: Sequence[dict[str, Any]],
) -> tuple[list[tuple[float, int]], list[tuple[int, int, float]]]:
    """Logged steps (median time over ranks, plus the step an injected fault fired at) and the
    time per step between two of them, less the saves that blocked the loop in between."""
    times: dict[int, list[float]] = {}
    blocked: dict[int, float] = {}
    for e in part:
        step = as_int(e.get("step"))
        if step is None:
            continue
        if e.get("event") == "step":
            times.setdefault(step, []).append(ts(e))
        elif e.get("event") == "checkpoint_staged":
            blocked[step] = max(blocked.get(step, 0.0), as_float(e.get("blocked_s")) or 0.0)
    for e in part:
        step = as_int(e.get("step"))
        if e.get("event") == "fault_injected" and step is not None and step not in times:
            times[step] = [ts(e)]
    points = sorted(((statistics.median(stamps), step) for step, stamps in times.items()), key=lambda p: p[1])
    saved = sorted(blocked)
    intervals = []
    for (ta, sa), (tb, sb) in zip(points, points[1:], strict=False):
        if tb < ta:
            continue
        stall = sum(blocked[x] for x in saved[bisect.bisect_left(saved, sa) : bisect.bisect_left(saved, sb)])
        intervals.append((sa, sb, max(0.0, tb - ta - stall) / (sb - sa)))
    return points, intervals


COMMITS = ("checkpoint_committed", "checkpoint_already_committed")
"""A verified checkpoint of the step is on storage (saved now, or kept from an earlier save)."""
REJECTIONS = ("checkpoint_corrupt", "checkpoint_rejected")
"""The step's checkpoint on storage was found damaged (or without ``COMMITTED``)."""


def commit_times(
    events: Sequence[dict[str, Any]], bounds: Sequence[float], t0: float
) -> list[tuple[float, int]]:
    """(seconds since the start, step) of each commit, once per stretch and step. A commit whose
    checkpoint was rejected later, before any restore from storage loaded it, is left out: that
    checkpoint could never have been gone back to."""
    first: dict[tuple[int, int], float] = {}
    unproven: dict[int, list[tuple[int, int]]] = {}  # step -> its commits not restored since
    for e in events:
        name, step = e.get("event"), as_int(e.get("step"))
        if step is None:
            continue
        if name in COMMITS:
            key = (bisect.bisect_right(bounds, ts(e)), step)
            if key not in first:
                first[key] = ts(e) - t0
                unproven.setdefault(step, []).append(key)
        elif name == "checkpoint_restored" and (e.get("origin") or e.get("source")) == "storage":
            unproven.pop(step, None)
        elif name in REJECTIONS:
            for key in unproven.pop(step, []):
                first.pop(key, None)
    return sorted((t, step) for (_, step), t in first.items())


def restart_layers(window: Sequence[dict[str, Any]], repeats: set[int]) -> list[str]:
    """The layer of each restart in ``window``, once across ranks and nodes, oldest first."""
    seen: set[tuple[object, ...]] = set()
    layers = []
    for e in window:
        name = e.get("event")
        if name == "restart_begin":
            layer = str(e.get("layer") or "in_job")
            round_ = e.get("iteration") if layer == "in_process" else e.get("attempts_left")
            key: tuple[object, ...] = (layer, round_) if round_ is not None else (layer, id(e))
        elif name == "relaunch":
            layer, key = "launcher", ("launcher", e.get("node"), e.get("attempt"))
        elif name == "launcher_start" and id(e) in repeats:
            layer, key = "pod", ("pod", id(e))
        else:
            continue
        if key not in seen:
            seen.add(key)
            layers.append(layer)
    return layers


def cause_of(window: Sequence[dict[str, Any]], repeats: set[int]) -> str:
    def first(name: str) -> dict[str, Any] | None:
        return next((e for e in window if e.get("event") == name), None)

    if (e := first("fault_injected")) is not None:
        return f"{e.get('kind', 'fault')} (injected)"
    if first("hang_detected") is not None:
        return "hang"
    restarted = [e for e in window if e.get("event") == "restart_begin" and e.get("cause")]
    if restarted:  # an in-process restart names its cause; the failing rank's is the fault
        own = [e for e in restarted if not str(e["cause"]).startswith("peer ")]
        return str((own or restarted)[0]["cause"])
    if (e := first("worker_failed")) is not None:
        return str(e["signal"]) if e.get("signal") else f"exit {e.get('exit_code')}"
    if (e := first("signal")) is not None:
        return str(e.get("signal", "signal"))
    if (e := next((e for e in window if is_fault(e)), None)) is not None:
        return f"launcher exit {e.get('exit_code')}"
    if first("relaunch") is not None:
        return "launcher lost"
    if any(id(e) in repeats for e in window):
        return "pod restarted"
    return "no fault logged"


def count_ranks(events: Sequence[dict[str, Any]]) -> int | None:
    worlds = [w for e in events if e.get("event") == "attempt_start" and (w := as_int(e.get("world")))]
    if worlds:
        return max(worlds)
    ranks = {
        e.get("rank") for e in events if e.get("event") in WORKER_EVENTS and as_int(e.get("rank")) is not None
    }
    return len(ranks) or None


def exit_code_of(events: Sequence[dict[str, Any]]) -> int | None:
    last: dict[object, int] = {}
    for e in events:
        code = as_int(e.get("exit_code"))
        if e.get("event") == "launcher_exit" and code is not None:
            last[e.get("node", e.get("host"))] = code
    if not last:
        return None
    failed = [c for c in last.values() if c != 0]
    return max(failed) if failed else 0

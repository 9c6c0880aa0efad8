"""Measured timings from a run's events log, in the ``Timings`` format that ``validate`` reads.

What each measure is made of (every rank's events count; medians and 95th percentiles):

* ``step``: ``step`` events' ``step_s`` (one step), leaving out the step right after a save,
  whose time includes that save's blocking.
* ``save_block``: ``checkpoint_staged.blocked_s`` less the ``waited_for_previous_s`` of its
  ``checkpoint_begin``: what a save blocks when the previous write is already done (for a
  sync save, also less its ``write_s``: the write is counted in ``save_write``).
* ``save_write``: ``checkpoint_committed.write_s``: staging done to checkpoint committed.
* ``restore``: ``checkpoint_restored.seconds`` of loads from storage (from host memory when no
  load from storage was logged).
* ``restart_in_process`` / ``restart_in_job``: a fault (``fault_injected``, ``worker_failed``
  or ``restart_begin``, the earliest of those before one recovery) to the first completed step
  of the next attempt. In-job when that attempt runs in new processes (``restart_count`` rose,
  or the launcher saw a worker fail), else in-process.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from nvtrain.errors import UsageError
from nvtrain.events import Events, is_event, number, read_events
from nvtrain.tuning.timings import Measure, Timings

__all__ = [
    "EVENTS_FILE",
    "Layer",
    "Measured",
    "Recovery",
    "RecoveryGroup",
    "events_file",
    "measure_events",
    "read_log",
    "read_measured",
    "recovery_groups",
    "recovery_list",
    "recovery_of",
    "step_times",
    "time_ordered",
]

EVENTS_FILE = "events.jsonl"
"""Name of the events log in a run directory (``<checkpoint dir>/<run id>/``)."""

Layer = Literal["in_process", "in_job"]

_TRIGGERS = ("fault_injected", "worker_failed", "restart_begin", "relaunch")
_NEW_PROCESSES = ("worker_failed", "relaunch")
_WAITED = 0.01
"""A save that waited longer than this (seconds) for the previous write counts as waiting."""

# What each measure needs in the log, and how to get it: (what is missing, fix).
_MISSING = {
    "step": (
        "step timings (`step` events with a step_s)",
        "run at least 10 steps per attempt, or give --step-time",
    ),
    "save_block": (
        "checkpoint saves (`checkpoint_staged` events)",
        "let the run save at least once ([checkpoint] interval below its steps), or give --save-block",
    ),
    "save_write": (
        "committed checkpoints (`checkpoint_committed` events)",
        "let at least one save be committed before the run ends, or give --save-write",
    ),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Recovery:
    """One recovery: a fault to the first completed step of the next attempt."""

    layer: Layer
    seconds: float
    """Fault to the first completed step (checkpoint load included)."""
    restore_s: float
    """Of which loading the checkpoint (slowest rank); 0 when none was loaded."""
    step: int | None
    """Step of the fault, when known."""


@dataclasses.dataclass(frozen=True)
class Measured:
    """Timings measured from one events log, and how many samples each is made of."""

    source: str
    timings: Timings
    counts: dict[str, int]
    """Samples per measure (keys as in ``Timings``)."""
    recoveries: tuple[Recovery, ...]
    restore_from: Literal["storage", "memory"] | None
    """Where the measured loads read from."""
    waits: tuple[float, ...]
    """Waits of saves for the previous write, when longer than 10 ms."""
    skipped: int = 0
    """Lines of the log that were skipped as not valid events."""

    def missing(self, names: Iterable[str]) -> list[tuple[str, str]]:
        """``(what is missing, fix)`` for each of ``names`` (``step``, ``save_block``,
        ``save_write``) that has no samples in this log; the file is named in each."""
        return [
            (f"{self.source} has no {_MISSING[n][0]}", _MISSING[n][1])
            for n in names
            if getattr(self.timings, n) is None
        ]

    def require(self, names: Iterable[str]) -> None:
        """Raise ``UsageError`` naming the file and what is missing, when any of ``names``
        has no samples."""
        missing = self.missing(names)
        if missing:
            raise UsageError("; ".join(w for w, _ in missing), "; ".join(f for _, f in missing))

    def restart(self, layer: Layer) -> tuple[float, int] | None:
        """Median recovery time of ``layer`` less its checkpoint load, and the sample count."""
        values = [r.seconds - r.restore_s for r in self.recoveries if r.layer == layer]
        if not values:
            return None
        return max(0.0, statistics.median(values)), len(values)


def events_file(path: Path, what: str = "--from-run") -> Path:
    """The events log at ``path``: the file itself, or ``events.jsonl`` in a run directory.
    ``what`` (the option or argument that named it) starts the error message."""
    target = path / EVENTS_FILE if path.is_dir() else path
    if not target.is_file():
        where = f"{path} has no {EVENTS_FILE}" if path.is_dir() else f"{path} does not exist"
        raise UsageError(
            f"{what}: {where}",
            f"give a run directory (<checkpoint dir>/<run id>) or its {EVENTS_FILE}",
        )
    return target


def read_log(path: Path, what: str = "--from-run") -> tuple[Path, Events]:
    """The events log at ``path`` (a file or a run directory) and its valid events (``skipped``
    counts the lines that were not); ``UsageError`` naming the file when it is missing,
    unreadable or holds no valid event."""
    target = events_file(path, what)
    try:
        events = read_events(target)
    except OSError as exc:
        raise UsageError(
            f"{what}: {target} cannot be read ({exc.strerror or exc})",
            "check the path and its permissions",
        ) from None
    if not events:
        skipped = events.skipped
        why = (
            f" with a time stamp and a name ({skipped} line{'s' if skipped != 1 else ''} skipped: an event "
            "is a JSON object with a finite number `ts`, a string `event` and numbers in its numeric fields)"
            if skipped
            else ""
        )
        raise UsageError(
            f"{what}: {target} holds no events{why}",
            f"give the {EVENTS_FILE} that `nvtrain run` wrote in the run directory",
        )
    return target, events


def read_measured(path: Path) -> Measured:
    """Measure the timings logged in the events log at ``path`` (a file or a run directory)."""
    target, events = read_log(path)
    return dataclasses.replace(measure_events(events, str(target)), skipped=events.skipped)


def time_ordered(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The valid events (``nvtrain.events.is_event``: a finite time stamp, a name, numbers in
    the numeric fields), oldest first: the order every analysis here uses. Events that
    ``read_events`` returns are all valid (and not checked again); others may come from elsewhere."""
    return sorted(events if isinstance(events, Events) else filter(is_event, events), key=_ts)


def _ts(event: dict[str, Any]) -> float:
    return float(event["ts"])


def measure_events(events: Sequence[dict[str, Any]], source: str) -> Measured:
    """Measure the timings of ``events`` (as ``read_events`` returns them); never raises."""
    ordered = time_ordered(events)
    saves = _saves(ordered)
    steps = _step_times(ordered, saves)
    blocks = [b for _, b in _blocks(ordered)]
    writes = [
        v for e in _named(ordered, "checkpoint_committed") if (v := _number(e.get("write_s"))) is not None
    ]
    restores, restore_from = _restores(ordered)
    recoveries = tuple(_recoveries(ordered))
    waits = tuple(
        w for e, _ in saves if (w := _number(e.get("waited_for_previous_s"))) is not None and w > _WAITED
    )
    by_layer = {
        layer: [r.seconds for r in recoveries if r.layer == layer] for layer in ("in_process", "in_job")
    }
    samples = {
        "step": steps,
        "save_block": blocks,
        "save_write": writes,
        "restore": restores,
        "restart_in_process": by_layer["in_process"],
        "restart_in_job": by_layer["in_job"],
    }
    timings = Timings(
        step=_measure(steps),
        save_block=_measure(blocks),
        save_write=_measure(writes),
        restore=_measure(restores),
        restart_in_process=_measure(by_layer["in_process"]),
        restart_in_job=_measure(by_layer["in_job"]),
    )
    counts = {name: len(values) for name, values in samples.items()}
    return Measured(source, timings, counts, recoveries, restore_from, waits)


def _named(events: Iterable[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == name]


def _number(value: object) -> float | None:
    """A duration: a finite number (``nvtrain.events.number``) that is not negative."""
    seconds = number(value)
    return seconds if seconds is not None and seconds >= 0 else None


def _saves(events: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """``checkpoint_begin`` events with their step."""
    return [(e, e["step"]) for e in _named(events, "checkpoint_begin") if isinstance(e.get("step"), int)]


def step_times(events: Sequence[dict[str, Any]]) -> list[float]:
    """The ``step`` measure's samples (``events`` time-ordered)."""
    return _step_times(events, _saves(events))


def _step_times(events: Sequence[dict[str, Any]], saves: list[tuple[dict[str, Any], int]]) -> list[float]:
    saved = {(e.get("pid"), step) for e, step in saves}
    times = []
    for e in _named(events, "step"):
        took, step = _number(e.get("step_s")), e.get("step")
        if took is None or not isinstance(step, int):
            continue
        if (e.get("pid"), step - 1) in saved:
            continue  # includes the blocking part of the save after the previous step
        times.append(took)
    return times


def _blocks(events: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """Each ``checkpoint_staged`` with its blocking time less the wait for the previous write."""
    begun: dict[tuple[Any, Any], dict[str, Any]] = {}
    out = []
    for e in events:
        key = (e.get("pid"), e.get("step"))
        if e.get("event") == "checkpoint_begin":
            begun[key] = e
        elif e.get("event") == "checkpoint_staged":
            blocked = _number(e.get("blocked_s"))
            if blocked is None:
                continue
            waited = _number(begun.pop(key, {}).get("waited_for_previous_s")) or 0.0
            if e.get("async") is False:  # a sync save's blocked_s includes its write
                waited += _number(e.get("write_s")) or 0.0
            out.append((e, max(0.0, blocked - waited)))
    return out


def _restores(events: Sequence[dict[str, Any]]) -> tuple[list[float], Literal["storage", "memory"] | None]:
    loads = _named(events, "checkpoint_restored")
    for origin in ("storage", "memory"):
        values = [
            v
            for e in loads
            if e.get("origin", e.get("source", "storage")) == origin
            and (v := _number(e.get("seconds"))) is not None
        ]
        if values:
            return values, origin
    return [], None


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryGroup:
    """The events of one recovery, as indexes into the time-ordered events."""

    triggers: tuple[int, ...]
    """The faults and restarts that the recovery answers, oldest first."""
    first_step: int | None
    """The first completed step of the next attempt; None when none followed (the run ended,
    or is still recovering)."""


def recovery_groups(
    events: Sequence[dict[str, Any]], is_trigger: Callable[[dict[str, Any]], bool] | None = None
) -> list[RecoveryGroup]:
    """Group faults by the first completed step that follows them (``events`` time-ordered).

    ``is_trigger`` says which events start a recovery (default: ``fault_injected``,
    ``worker_failed``, ``restart_begin``, ``relaunch``). Triggers that no completed step
    follows form one last group with ``first_step`` None. One pass over the events.
    """
    triggered = is_trigger or (lambda e: e.get("event") in _TRIGGERS)
    groups: list[RecoveryGroup] = []
    pending: list[int] = []
    for i, e in enumerate(events):
        if pending and e.get("event") == "step" and "step_s" in e and e.get("step_s") is None:
            groups.append(RecoveryGroup(tuple(pending), i))  # a trigger belongs to a later step
            pending = []
        if triggered(e):
            pending.append(i)
    if pending:
        groups.append(RecoveryGroup(tuple(pending), None))
    return groups


def recovery_of(events: Sequence[dict[str, Any]], group: RecoveryGroup) -> Recovery | None:
    """The recovery that ``group`` records (None when no completed step followed it)."""
    return recovery_list(events, [group])[0]


def recovery_list(events: Sequence[dict[str, Any]], groups: Sequence[RecoveryGroup]) -> list[Recovery | None]:
    """``recovery_of`` each of ``groups`` (oldest first, as ``recovery_groups`` returns them),
    in one pass over the events before the last of them."""
    out: list[Recovery | None] = []
    highest: int | None = None  # the highest restart_count of the steps seen so far
    seen = 0
    for group in groups:
        start = group.triggers[0]
        for e in events[seen:start]:
            count = e.get("restart_count")
            if e.get("event") == "step" and isinstance(count, int):
                highest = count if highest is None else max(highest, count)
        seen = max(seen, start)
        out.append(None if group.first_step is None else _recovery(events, group, highest))
    return out


def _recovery(events: Sequence[dict[str, Any]], group: RecoveryGroup, highest_before: int | None) -> Recovery:
    assert group.first_step is not None
    first_index, start = group.first_step, group.triggers[0]
    first = events[first_index]
    triggers = [events[i] for i in group.triggers]
    count = first.get("restart_count")
    rose = isinstance(count, int) and highest_before is not None and count > highest_before
    new_processes = any(
        t.get("event") in _NEW_PROCESSES
        or (t.get("event") == "restart_begin" and t.get("layer") != "in_process")
        for t in triggers
    )
    loads = [
        v
        for e in events[start:first_index]
        if e.get("event") == "checkpoint_restored" and (v := _number(e.get("seconds"))) is not None
    ]
    fault_step = next((t.get("step") for t in triggers if isinstance(t.get("step"), int)), None)
    return Recovery(
        layer="in_job" if rose or new_processes else "in_process",
        seconds=float(first["ts"]) - float(events[start]["ts"]),
        restore_s=max(loads, default=0.0),
        step=fault_step,
    )


def _recoveries(events: Sequence[dict[str, Any]]) -> Iterable[Recovery]:
    return [r for r in recovery_list(events, recovery_groups(events)) if r is not None]


def _measure(values: Sequence[float]) -> Measure | None:
    if not values:
        return None
    # Durations in the Timings model are > 0: a 0 s sample (rounded) becomes 1 µs.
    clean = sorted(max(v, 1e-6) for v in values)
    p95 = clean[0] if len(clean) == 1 else statistics.quantiles(clean, n=20, method="inclusive")[18]
    return Measure(median=statistics.median(clean), p95=p95, max=clean[-1])


def _origin(restored: dict[str, Any]) -> str:
    """Where a checkpoint was loaded from (older logs call the field ``source``)."""
    return str(restored.get("origin", restored.get("source", "storage")))

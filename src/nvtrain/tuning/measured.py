"""Measured timings from a run's events log, in the ``Timings`` format that ``validate`` reads.

What each measure is made of (every rank's events count; medians and 95th percentiles):

* ``step``: ``step`` events' ``step_s`` (one step), leaving out the step right after a save,
  whose time includes that save's blocking.
* ``save_block``: ``checkpoint_staged.blocked_s`` less the ``waited_for_previous_s`` of its
  ``checkpoint_begin``: what a save blocks when the previous write is already done (for a
  sync save, also less its ``write_s``: the write is counted in ``save_write``).
* ``save_write``: ``checkpoint_committed.write_s``: staging done to checkpoint committed.
* ``restore``: ``checkpoint_restored.seconds`` of loads from storage (from a peer's host memory
  when no load from storage was logged, else from the pod's own host memory).
* ``by_origin``: per origin (host memory, a peer's host memory, storage): the loads' count and
  median, and how many recoveries (that reached a step) loaded from it (a recovery whose ranks
  read from different origins counts for the slowest: ``Recovery.restored_from``).
  ``restore_per_recovery`` weighs each origin's median by its share of those recoveries: the
  load a recovery of this run can expect, which ``tune-interval`` uses (the first start's load
  follows no fault and weighs nothing).
* ``restart_in_process`` / ``restart_in_job``: a fault or restart (the earliest before one
  recovery) to the first completed step of the next attempt. In-job when that attempt runs in
  new processes (``restart_count`` rose, the launcher saw a worker fail or restarted in job, it
  was relaunched, or the pod was restarted), else in-process.

The events are read and grouped once, by ``nvtrain.runlog`` (which ``report`` uses too).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from nvtrain.config.timings import Measure, Timings
from nvtrain.errors import UsageError
from nvtrain.events.records import Event
from nvtrain.runlog import (
    ORIGINS,
    Layer,
    Origin,
    Recovery,
    RunLog,
    loads_by_origin,
    read_log,
    recovery_origins,
)

__all__ = [
    "Layer",
    "Measured",
    "Origin",
    "OriginLoads",
    "Recovery",
    "measure_events",
    "read_measured",
]

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
class OriginLoads:
    """The checkpoint loads from one origin (host memory, a peer's host memory, or storage)."""

    loads: int
    """Loads logged with their seconds (every rank's, the first start's too)."""
    median: float | None
    """Their median seconds; None when there were none."""
    recoveries: int
    """Recoveries (that reached a step) whose load read from here."""


@dataclasses.dataclass(frozen=True)
class Measured:
    """Timings measured from one events log, and how many samples each is made of."""

    source: str
    timings: Timings
    counts: dict[str, int]
    """Samples per measure (keys as in ``Timings``)."""
    recoveries: tuple[Recovery, ...]
    """The recoveries that reached a step (``RunLog.recoveries``)."""
    restore_from: Origin | None
    """Where the restore figure's loads read from: the origin most recoveries loaded from
    (the slowest on a tie: storage, then peer; see ``weighed``); without such recoveries, where
    ``timings.restore``'s loads read from."""
    waits: tuple[float, ...]
    """Waits of saves for the previous write, when longer than 10 ms."""
    skipped: int = 0
    """Lines of the log that were skipped as not valid events."""
    by_origin: Mapping[Origin, OriginLoads] = dataclasses.field(default_factory=dict)
    """The loads and recoveries per origin (each of ``memory``, ``peer``, ``storage``)."""
    warnings: tuple[str, ...] = ()
    """One line per file of the log whose events of another run were left out
    (``nvtrain.runlog.RunEvents.warnings``)."""

    @property
    def weighed(self) -> dict[Origin, OriginLoads]:
        """The origins that ``restore_per_recovery`` weighs: those that recoveries loaded from
        and whose loads were measured."""
        return _weighed(self.by_origin)

    def restore_per_recovery(self) -> float | None:
        """The load a recovery can expect: each origin's median weighted by the share of the
        recoveries that loaded from it; None when no recovery loaded from a measured origin."""
        weighed = self.weighed.values()
        total = sum(v.recoveries for v in weighed)
        if not total:
            return None
        return sum(v.recoveries * (v.median or 0.0) for v in weighed) / total

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
        values = [
            s - r.restore_s for r in self.recoveries if r.layer == layer and (s := r.seconds) is not None
        ]
        if not values:
            return None
        return max(0.0, statistics.median(values)), len(values)


def read_measured(path: Path) -> Measured:
    """Measure the timings logged in the events log at ``path`` (a file or a run directory);
    only one run's events count (``read_log``: ``warnings`` says which were left out)."""
    target, events = read_log(path)
    measured = measure_events(RunLog(events), str(target))
    return dataclasses.replace(measured, warnings=tuple(events.warnings()))


def measure_events(events: RunLog | Iterable[Event], source: str) -> Measured:
    """Measure the timings of ``events`` (a ``RunLog``, or records as ``read_events`` returns
    them); never raises."""
    log = events if isinstance(events, RunLog) else RunLog(events)
    steps, blocks, writes = log.step_times, log.save_blocks, log.save_writes
    restores, restore_from = log.loads
    recoveries = tuple(r for r in log.recoveries if r.recovered)
    by_layer = {
        layer: [s for r in recoveries if r.layer == layer and (s := r.seconds) is not None]
        for layer in ("in_process", "in_job")
    }
    samples: dict[str, Sequence[float]] = {
        "step": steps,
        "save_block": blocks,
        "save_write": writes,
        "restore": restores,
        "restart_in_process": by_layer["in_process"],
        "restart_in_job": by_layer["in_job"],
    }
    timings = Timings(**{name: _measure(values) for name, values in samples.items()})
    counts = {name: len(values) for name, values in samples.items()}
    by_origin = _by_origin(loads_by_origin(log.events), recovery_origins(recoveries))
    weighed = _weighed(by_origin)
    if weighed:
        restore_from = _most(weighed)
    return Measured(source, timings, counts, recoveries, restore_from, log.save_waits, log.skipped, by_origin)


def _by_origin(
    loads: Mapping[Origin, Sequence[float]], recovered: Mapping[Origin, int]
) -> dict[Origin, OriginLoads]:
    return {
        o: OriginLoads(
            loads=len(loads[o]),
            median=statistics.median(loads[o]) if loads[o] else None,
            recoveries=recovered[o],
        )
        for o in ORIGINS
    }


def _measure(values: Sequence[float]) -> Measure | None:
    if not values:
        return None
    # Durations in the Timings model are > 0: a 0 s sample (rounded) becomes 1 µs.
    clean = sorted(max(v, 1e-6) for v in values)
    p95 = clean[0] if len(clean) == 1 else statistics.quantiles(clean, n=20, method="inclusive")[18]
    return Measure(median=statistics.median(clean), p95=p95, max=clean[-1])


def _weighed(by_origin: Mapping[Origin, OriginLoads]) -> dict[Origin, OriginLoads]:
    return {o: v for o, v in by_origin.items() if v.recoveries and v.median is not None}


def _most(weighed: Mapping[Origin, OriginLoads]) -> Origin:
    """The origin most recoveries loaded from, the slowest on a tie (storage, then peer)."""
    return max(weighed, key=lambda o: (weighed[o].recoveries, ORIGINS.index(o)))

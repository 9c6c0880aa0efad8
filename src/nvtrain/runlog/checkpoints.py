"""Checkpoints: commits, saves and what they blocked, loads, from the stretches of a run."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from nvtrain.events.records import (
    CheckpointBegin,
    CheckpointCommitted,
    CheckpointFailed,
    CheckpointPartial,
    CheckpointRestored,
    CheckpointSettled,
    CheckpointStaged,
    Event,
)
from nvtrain.runlog.kinds import COMMITS, REJECTIONS, duration, restore_origin
from nvtrain.runlog.recoveries import Recovery

__all__ = [
    "ORIGINS",
    "WAITED",
    "Origin",
    "Saves",
    "find_commits",
    "find_saves",
    "load_times",
    "loads_by_origin",
    "recovery_origins",
    "save_block_times",
    "save_wait_times",
    "save_write_times",
]

Origin = Literal["memory", "peer", "storage"]
"""Where a checkpoint load read from: the host copy in its own pod, the host copy in another
pod's memory (a rank of a replaced pod), or storage."""
ORIGINS: tuple[Origin, ...] = ("memory", "peer", "storage")
"""Every origin, the fastest first."""

WAITED = 0.01
"""A save that waited longer than this (seconds) for the previous write counts as waiting."""


@dataclasses.dataclass(frozen=True, slots=True)
class Saves:
    """The run's saves: one save is every rank's save of one step in one stretch."""

    count: int
    blocked: tuple[float, ...]
    """Seconds the loop was blocked, per save (the slowest rank)."""
    blocked_ended: tuple[float, ...]
    """The same, per save that ended (committed or failed): its value no longer changes, as
    every rank had staged its part before the save could end."""
    waited: tuple[float, ...]
    """Seconds waited for the previous save's write, per save that waited (more than ``WAITED``)."""
    background: tuple[float, ...]
    """Seconds per background write (staged to committed; sync saves left out), per save."""
    failed: int
    committed: int
    """Saves with a commit logged (a checkpoint found damaged later included; ``find_commits``
    leaves those out)."""
    partial: int
    """Partial checkpoints found (one folder counts once)."""
    corrupt: int
    """Corrupt or rejected checkpoints found (one folder counts once)."""
    settled: tuple[tuple[float, bool], ...]
    """Per save in flight at a soft fault: (seconds waited, the slowest rank; every rank let it
    finish)."""


def find_commits(parts: Sequence[Sequence[Event]]) -> tuple[tuple[float, int], ...]:
    """(unix time, step) of each commit, once per stretch (``parts``) and step, oldest first. A
    commit whose checkpoint was rejected later, before any restore from storage loaded it, is
    left out: that checkpoint could never have been gone back to."""
    first: dict[tuple[int, int], float] = {}
    unproven: dict[int, list[tuple[int, int]]] = {}  # step -> its commits not restored since
    for k, part in enumerate(parts):
        for e in part:
            if isinstance(e, COMMITS) and e.step is not None:
                key = (k, e.step)
                if key not in first:
                    first[key] = e.ts
                    unproven.setdefault(e.step, []).append(key)
            elif isinstance(e, CheckpointRestored) and e.step is not None:
                if restore_origin(e) == "storage":
                    unproven.pop(e.step, None)
            elif isinstance(e, REJECTIONS) and e.step is not None:
                for key in unproven.pop(e.step, []):
                    first.pop(key, None)
    return tuple(sorted((t, step) for (_, step), t in first.items()))


def find_saves(parts: Sequence[Sequence[Event]]) -> Saves:
    """The saves of each stretch (``parts``), every rank's events of one step together."""
    blocked: dict[tuple[int, int], float] = {}
    waited: dict[tuple[int, int], float] = {}
    written: dict[tuple[int, int], float] = {}
    sync: set[tuple[int, int]] = set()
    failed: set[tuple[int, int]] = set()
    committed: set[tuple[int, int]] = set()
    partial: set[object] = set()
    corrupt: set[object] = set()
    settled: dict[tuple[int, int], tuple[float, bool]] = {}
    for k, part in enumerate(parts):
        for e in part:
            if isinstance(e, CheckpointStaged):
                key = (k, _step(e.step))
                blocked[key] = max(blocked.get(key, 0.0), e.blocked_s or 0.0)
                if e.is_async is False:
                    sync.add(key)
            elif isinstance(e, CheckpointBegin):
                key = (k, _step(e.step))
                waited[key] = max(waited.get(key, 0.0), e.waited_for_previous_s or 0.0)
            elif isinstance(e, COMMITS):
                key = (k, _step(e.step))
                committed.add(key)
                if isinstance(e, CheckpointCommitted) and e.write_s is not None:
                    written[key] = max(written.get(key, 0.0), e.write_s)
            elif isinstance(e, CheckpointFailed):
                failed.add((k, _step(e.step)))
            elif isinstance(e, CheckpointPartial):
                partial.add(e.path if e.path is not None else e.step)
            elif isinstance(e, REJECTIONS):  # one folder counts once
                corrupt.add(e.path if e.path is not None else e.step)
            elif isinstance(e, CheckpointSettled):
                key = (k, _step(e.step))
                before = settled.get(key, (0.0, True))
                settled[key] = (max(before[0], e.waited_s or 0.0), before[1] and e.finished is True)
    return Saves(
        count=len(set(blocked) | set(waited)),
        blocked=tuple(blocked.values()),
        blocked_ended=tuple(v for k, v in blocked.items() if k in committed or k in failed),
        waited=tuple(w for w in waited.values() if w > WAITED),
        background=tuple(v for k, v in written.items() if k not in sync),
        failed=len(failed),
        committed=len(committed),
        partial=len(partial),
        corrupt=len(corrupt),
        settled=tuple(settled.values()),
    )


def _step(step: int | None) -> int:
    return step if step is not None else -1


# -- samples, every rank's events counted (what ``tune-interval`` measures) ---------------------


def save_block_times(events: Sequence[Event]) -> tuple[float, ...]:
    """Per ``checkpoint_staged``: its ``blocked_s`` less its ``checkpoint_begin``'s wait for the
    previous write (and, for a sync save, less its write)."""
    begun: dict[tuple[int | None, int | None], CheckpointBegin] = {}
    out = []
    for e in events:
        if isinstance(e, CheckpointBegin):
            begun[(e.pid, e.step)] = e
        elif isinstance(e, CheckpointStaged):
            blocked = duration(e.blocked_s)
            if blocked is None:
                continue
            begin = begun.pop((e.pid, e.step), None)
            waited = (duration(begin.waited_for_previous_s) if begin is not None else None) or 0.0
            if e.is_async is False:  # a sync save's blocked_s includes its write
                waited += duration(e.write_s) or 0.0
            out.append(max(0.0, blocked - waited))
    return tuple(out)


def save_write_times(events: Sequence[Event]) -> tuple[float, ...]:
    """``write_s`` of each ``checkpoint_committed``: staging done to checkpoint committed."""
    return tuple(
        v for e in events if isinstance(e, CheckpointCommitted) and (v := duration(e.write_s)) is not None
    )


def save_wait_times(events: Sequence[Event]) -> tuple[float, ...]:
    """Waits of saves for the previous write, when longer than ``WAITED``."""
    return tuple(
        w
        for e in events
        if isinstance(e, CheckpointBegin)
        and e.step is not None
        and (w := duration(e.waited_for_previous_s)) is not None
        and w > WAITED
    )


def load_times(events: Sequence[Event]) -> tuple[tuple[float, ...], Origin | None]:
    """``seconds`` of the checkpoint loads from the slowest origin measured: storage, else a
    peer's host memory, else the pod's own (a load that does not say counts as one from
    storage), and where they read from."""
    loads = loads_by_origin(events)
    for origin in reversed(ORIGINS):
        if loads[origin]:
            return loads[origin], origin
    return (), None


def loads_by_origin(events: Sequence[Event]) -> dict[Origin, tuple[float, ...]]:
    """``seconds`` of every checkpoint load, per origin (each of ``ORIGINS``; a load that does
    not say counts as one from storage)."""
    loads: dict[Origin, list[float]] = {origin: [] for origin in ORIGINS}
    for e in events:
        if isinstance(e, CheckpointRestored) and (seconds := duration(e.seconds)) is not None:
            loads[_origin(restore_origin(e))].append(seconds)
    return {origin: tuple(values) for origin, values in loads.items()}


def recovery_origins(recoveries: Sequence[Recovery]) -> dict[Origin, int]:
    """How many of ``recoveries`` loaded a checkpoint from each origin (each of ``ORIGINS``;
    one that does not say counts as one from storage); those that loaded none are left out."""
    counts: dict[Origin, int] = dict.fromkeys(ORIGINS, 0)
    for r in recoveries:
        if r.restored is not None:
            counts[_origin(r.restored_from)] += 1
    return counts


def _origin(where: str | None) -> Origin:
    """``where`` as an origin; one that does not say (or is unknown) counts as storage."""
    return "memory" if where == "memory" else "peer" if where == "peer" else "storage"

"""Which records are what, for the analysis: the workers' events, faults, restarts, commits."""

from __future__ import annotations

from collections.abc import Iterable

from nvtrain.events.records import (
    AttemptStart,
    CheckpointAlreadyCommitted,
    CheckpointBegin,
    CheckpointCommitted,
    CheckpointCorrupt,
    CheckpointFailed,
    CheckpointPartial,
    CheckpointRejected,
    CheckpointRestored,
    CheckpointSettled,
    CheckpointStaged,
    Event,
    FaultInjected,
    HangDetected,
    LauncherExit,
    LauncherStart,
    Relaunch,
    RestartBegin,
    RestartEnd,
    SignalReceived,
    Step,
    WorkerFailed,
    WorkerStart,
)

__all__ = [
    "COMMITS",
    "REJECTIONS",
    "RESTORE_ORIGINS",
    "WORKER_EVENTS",
    "duration",
    "is_fault",
    "is_restart",
    "pod_restarts",
    "restore_origin",
]

WORKER_EVENTS = (
    WorkerStart,
    AttemptStart,
    Step,
    CheckpointBegin,
    CheckpointStaged,
    CheckpointCommitted,
    CheckpointAlreadyCommitted,
    CheckpointRestored,
    CheckpointSettled,
    CheckpointPartial,
    CheckpointCorrupt,
    CheckpointRejected,
    CheckpointFailed,
    FaultInjected,
    RestartEnd,
)
"""What the workers log (and an in-process ``RestartBegin``)."""
_FAULTS = (FaultInjected, HangDetected, WorkerFailed, SignalReceived)
COMMITS = (CheckpointCommitted, CheckpointAlreadyCommitted)
"""A verified checkpoint of the step is on storage (saved now, or kept from an earlier save)."""
REJECTIONS = (CheckpointCorrupt, CheckpointRejected)
"""The step's checkpoint on storage was found damaged (or without ``COMMITTED``)."""
RESTORE_ORIGINS = ("memory", "peer", "storage")
"""Where a checkpoint load can read from (``restore_origin``), the fastest first."""


def is_fault(e: Event) -> bool:
    """An injected fault, a hang, a failed worker, a signal to ``nvtrain run``, or a launcher
    that exited with a non-zero code. A worker that ended because it was told to stop
    (``WorkerEnded``, and ``worker_failed`` with ``stopped: true`` of older logs) is none."""
    return isinstance(e, _FAULTS) or (isinstance(e, LauncherExit) and e.failed)


def pod_restarts(events: Iterable[Event]) -> frozenset[int]:
    """``id`` of each ``LauncherStart`` of a node that had started before (``events`` oldest
    first): the pod was restarted."""
    seen: set[object] = set()
    repeats = set()
    for e in events:
        if isinstance(e, LauncherStart):
            if e.where in seen:
                repeats.add(id(e))
            seen.add(e.where)
    return frozenset(repeats)


def is_restart(e: Event, pods: frozenset[int]) -> bool:
    """A restart of any layer; ``pods``: the run's ``pod_restarts``."""
    return isinstance(e, (RestartBegin, Relaunch)) or id(e) in pods


def restore_origin(e: CheckpointRestored) -> str | None:
    """Where a load read from: ``storage``, ``memory`` (the host copy in its own pod) or
    ``peer`` (a replaced pod's rank, from the host copy in another pod's memory); logs before
    ``origin`` named it ``source``. None when the event does not say."""
    where = e.origin if e.origin is not None else e.source
    return where if where in RESTORE_ORIGINS else None


def duration(value: float | None) -> float | None:
    """A duration field's value; None when absent or negative."""
    return value if value is not None and value >= 0 else None

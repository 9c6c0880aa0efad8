"""What the workers log: their start, attempts, steps, faults, stops and in-process restarts."""

from __future__ import annotations

from nvtrain.events.base import Event, event_type

__all__ = [
    "AttemptStart",
    "FaultInjected",
    "ObjectReused",
    "RestartBegin",
    "RestartEnd",
    "Step",
    "WorkerGaveUp",
    "WorkerStart",
    "WorkerStopped",
    "WorkerThreadError",
]


@event_type("worker_start")
class WorkerStart(Event):
    """A worker process started (before its first in-process attempt)."""

    restart_count: int | None = None
    """ft_launcher's restart round (``TORCHELASTIC_RESTART_COUNT``): 0 for the first processes."""
    warm: bool | None = None
    """Forked from the warm-start server (``[job] warm_start``); its ``pid`` is then the one
    ft_launcher knows (the client's)."""


@event_type("attempt_start")
class AttemptStart(Event):
    """An in-process attempt starts (NVRx ``Wrapper`` iteration)."""

    world: int | None = None
    iteration: int | None = None
    restart_count: int | None = None


@event_type("step")
class Step(Event):
    """A completed training step (sampled; always the first of an attempt, saves, the last).
    User metrics passed to ``step_done`` are in ``extra``."""

    step: int | None = None
    step_s: float | None = None
    """Time since the previous step; null for the first step of an attempt (it ends a recovery)."""
    attempt: int | None = None
    restart_count: int | None = None
    unsampled: bool | None = None
    """Logged late, at the end of an attempt, because sampling had skipped it (``ts`` is when it
    completed)."""

    NULL_KEPT = frozenset({"step_s"})

    @property
    def first_of_attempt(self) -> bool:
        return self.step_s is None


@event_type("fault_injected")
class FaultInjected(Event):
    step: int | None = None
    kind: str | None = None


@event_type("object_reused")
class ObjectReused(Event):
    key: str | None = None
    iteration: int | None = None


@event_type("worker_stopped")
class WorkerStopped(Event):
    """A worker told to stop (SIGTERM from ft_launcher) is about to exit."""

    signal: str | None = None
    forced: bool | None = None
    waited_s: float | None = None


@event_type("worker_gave_up")
class WorkerGaveUp(Event):
    """The in-process layer gave up; the fault goes to ft_launcher."""

    reason: str | None = None


@event_type("worker_thread_error")
class WorkerThreadError(Event):
    thread: str | None = None
    error: str | None = None


@event_type("restart_begin")
class RestartBegin(Event):
    """A restart begins: ``in_process`` (a worker, one per rank) or ``in_job`` (ft_launcher)."""

    layer: str | None = None
    iteration: int | None = None
    cause: str | None = None
    detail: str | None = None
    attempts_left: int | None = None
    max_restarts: int | None = None

    @property
    def in_process(self) -> bool:
        return self.layer == "in_process"


@event_type("restart_end")
class RestartEnd(Event):
    layer: str | None = None
    iteration: int | None = None
    ts_mono: float | None = None

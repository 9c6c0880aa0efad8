"""What ``nvtrain run`` logs: its own start, exit and decisions; what it reads from
ft_launcher's output (a worker's exit, a missed heartbeat, a rendezvous); and what it only shows
(its ``Reporter``), never logs."""

from __future__ import annotations

import dataclasses

from nvtrain.events.base import Event, event_type

__all__ = [
    "DnsResolved",
    "DnsWait",
    "Escalated",
    "EventsLogError",
    "EventsLogResumed",
    "HangBlamed",
    "HangDetected",
    "KilledLeftovers",
    "LauncherError",
    "LauncherExit",
    "LauncherOutputError",
    "LauncherStart",
    "LauncherStarted",
    "MetricsLinger",
    "Relaunch",
    "RendezvousDone",
    "SignalReceived",
    "TerminationLogError",
    "WorkerEnded",
    "WorkerExit",
    "WorkerFailed",
]


# -- the launcher's own ------------------------------------------------------------------------


@event_type("launcher_start")
class LauncherStart(Event):
    argv: tuple[str, ...] | None = None
    endpoint: str | None = None
    is_host: bool | None = None
    metrics_port: int | None = None


@event_type("launcher_started")
class LauncherStarted(Event):
    """ft_launcher was started (again, after ``relaunch``)."""

    launcher_pid: int | None = None


@event_type("launcher_exit")
class LauncherExit(Event):
    exit_code: int | None = None
    cause: str | None = None

    @property
    def failed(self) -> bool:
        return self.exit_code not in (0, None)


@event_type("relaunch")
class Relaunch(Event):
    layer: str | None = None
    reason: str | None = None
    attempt: int | None = None


@event_type("killed_leftovers")
class KilledLeftovers(Event):
    pids: tuple[int, ...] | None = None


@event_type("escalated")
class Escalated(Event):
    """nvtrain decided that the failures repeat without progress and stops the run (exit 4):
    ft_launcher is frozen at once, so that no new round starts, and its tree is stopped."""

    reason: str | None = None
    failures: int | None = None
    """Failures counted in a row when it decided."""
    error: str | None = None
    """The script's error (the last line of its traceback), when known; a failure before the first
    step that repeated with the same error stops the run before ``[restart] escalate_after``."""


@event_type("hang_blamed")
class HangBlamed(Event):
    """Which worker of this node a hang is blamed on. A rank blocked in a collective misses its
    heartbeats too, so the rank monitor that fires first may name a healthy rank: a worker whose
    process is stopped (SIGSTOP, a debugger) is the one that hung; it is ended with ``signal``
    (it cannot act on SIGTERM). When no process tells, ``candidates`` lists the local ranks the
    hang may be in, and ``local_rank`` is null. ``rank``: the culprit's global rank, if known."""

    local_rank: int | None = None
    worker_pid: int | None = None
    state: str | None = None
    """Its process state: ``stopped`` or ``tracing-stop``."""
    signal: str | None = None
    """The signal nvtrain sent to end it (``SIGKILL``)."""
    candidates: tuple[int, ...] | None = None
    """Local ranks the hang may be in, when none can be named."""


@event_type("signal")
class SignalReceived(Event):
    """``nvtrain run`` received a signal it forwards (the pod is being stopped)."""

    signal: str | None = None


@event_type("dns_resolved")
class DnsResolved(Event):
    target: str | None = dataclasses.field(default=None, metadata={"key": "name"})
    """The name that was waited for (pod 0's, or the control pod's)."""
    addresses: tuple[str, ...] | None = None


# -- read from ft_launcher (NVRx) -----------------------------------------------------------


@dataclasses.dataclass(slots=True, kw_only=True)
class WorkerExit(Event):
    """The fields of ``worker_failed`` and ``worker_ended``: ft_launcher saw a worker exit with an
    error (``exit_code`` < 0: killed by ``signal``). ``rank``: its global rank, when the worker
    logged its start (ft_launcher names the local rank only)."""

    local_rank: int | None = None
    worker_pid: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    hang: bool | None = None
    """Its rank monitor had reported a missing heartbeat first."""
    step: int | None = None
    """The highest step the job had reached when it failed (not necessarily where this attempt
    was: after a rollback it is the step before it), if the workers report steps. Escalation
    counts failures in a row without a new highest step."""
    gave_up: str | None = None
    """Why its in-process layer gave up first, when it logged ``worker_gave_up``."""
    raised: str | None = None
    """The exception it raised, the last line of the traceback torch.distributed printed for it
    (``RuntimeError: boom``). A rank that raised before the worker ft_launcher named failed is
    logged first, with ``exit_code`` and maybe ``worker_pid`` unknown (it was still exiting)."""

    NULL_KEPT = frozenset({"signal"})
    """``signal`` null: it exited with a code, it was not killed."""


@event_type("worker_failed")
class WorkerFailed(WorkerExit):
    """A worker failed: a fault. Logs from before ``worker_ended`` logged a worker that had been
    told to stop as a ``worker_failed`` with ``stopped: true``; it reads as a ``WorkerEnded``."""


@event_type("worker_ended")
class WorkerEnded(WorkerExit):
    """A worker ended because it was asked to (``reason``), with an error status: no fault, never
    the root cause, not counted for escalation."""

    reason: str | None = None
    """``stopped``: it had been told to stop: it logged ``worker_stopped`` (ft_launcher stopping the
    workers for a restart, a SIGTERM from outside), or ``nvtrain run`` was stopping the job."""


@event_type("hang_detected")
class HangDetected(Event):
    """A rank monitor missed a worker's heartbeat. NVRx 0.4 names the worker by its global
    ``rank``, 0.6/0.7 by its ``local_rank``."""

    local_rank: int | None = None
    heartbeat: str | None = None
    """``initial`` or ``subsequent``: which heartbeat did not come."""
    section: str | None = None
    """With NVRx's sections API: the section open for longer than its timeout
    (``[heartbeat.sections]``), or ``out-of-section`` when none was open for longer than
    ``out_of_section_timeout``; None for a missed heartbeat."""


@event_type("launcher_error")
class LauncherError(Event):
    message: str | None = None
    error: str | None = None
    """The exception's class name (``RendezvousTimeoutError``), when the message names one."""


@event_type("rendezvous_done")
class RendezvousDone(Event):
    round: int | None = None
    group_rank: int | None = None
    nodes: int | None = None


# -- shown only (the launcher's ``Reporter``), never logged -------------------------------------


@event_type("dns_wait", logged=False)
class DnsWait(Event):
    target: str | None = dataclasses.field(default=None, metadata={"key": "name"})
    error: str | None = None
    waited: float | None = None


@event_type("launcher_output_error", logged=False)
class LauncherOutputError(Event):
    error: str | None = None


@event_type("events_log_error", logged=False)
class EventsLogError(Event):
    path: str | None = None
    error: str | None = None


@event_type("events_log_resumed", logged=False)
class EventsLogResumed(Event):
    path: str | None = None
    dropped: int | None = None


@event_type("termination_log_error", logged=False)
class TerminationLogError(Event):
    path: str | None = None
    error: str | None = None
    variable: str | None = None


@event_type("metrics_linger", logged=False)
class MetricsLinger(Event):
    """The run has ended; its final figures are served on ``port`` for ``seconds`` more
    (``[metrics] linger``), or until a signal."""

    port: int | None = None
    seconds: float | None = None

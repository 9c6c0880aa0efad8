"""The events of a run, as typed records: every event's name and fields are defined here once.

The events log (``events-node<N>.jsonl``, one per pod in the run directory) is the contract
between the launcher, the workers, ``report``, ``tune-interval`` and the live metrics. Every
writer builds one of these records and hands it to ``EventLog.emit``; every reader gets them
back from ``parse_event`` / ``read_events``, never a bare dict.

On disk an event is one JSON object: ``ts``, ``event`` (the record's ``NAME``), ``v`` (the
schema version it was written with; logs from before versions have none and read as 0, with
the same fields), the writer's common fields (``host``, ``pid``, ``node``, ``run_id``,
``source``) and the record's own fields. Fields a reader does not know are kept in ``extra``
(user metrics on ``step``, fields of a newer writer); an event name it does not know reads as
``OtherEvent``.

Field types are checked once, at parse time: a number field holds a finite number within
``MAX_NUMBER`` or null, else the line is not an event; an integer field given a fraction reads
as None; a name field (a string) never holds a list or an object.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, TypeVar, dataclass_transform

__all__ = [
    "EVENT_TYPES",
    "MAX_NUMBER",
    "SCHEMA_VERSION",
    "AttemptStart",
    "CheckpointAlreadyCommitted",
    "CheckpointBegin",
    "CheckpointCommitted",
    "CheckpointCorrupt",
    "CheckpointFailed",
    "CheckpointPartial",
    "CheckpointRejected",
    "CheckpointReplicated",
    "CheckpointRestored",
    "CheckpointSettled",
    "CheckpointStaged",
    "DnsResolved",
    "DnsWait",
    "Escalated",
    "Event",
    "EventsLogError",
    "EventsLogResumed",
    "FaultInjected",
    "HangBlamed",
    "HangDetected",
    "KilledLeftovers",
    "LauncherError",
    "LauncherExit",
    "LauncherOutputError",
    "LauncherStart",
    "LauncherStarted",
    "MetricsLinger",
    "ObjectReused",
    "OtherEvent",
    "Relaunch",
    "RendezvousDone",
    "RestartBegin",
    "RestartEnd",
    "SignalReceived",
    "Step",
    "TerminationLogError",
    "WorkerEnded",
    "WorkerExit",
    "WorkerFailed",
    "WorkerGaveUp",
    "WorkerStart",
    "WorkerStopped",
    "WorkerThreadError",
    "from_fields",
]

SCHEMA_VERSION: Final = 1
"""Written as ``v`` in every event. 0 (no ``v``): logs of nvtrain before versioned events, which
carry the same fields."""

MAX_NUMBER: Final = 1e15
"""Largest magnitude of a number field: anything larger is no real value (a time, a duration,
a step, a rank), and sums of such numbers would overflow to infinity."""

_INTERNED = 64
"""String values up to this length are interned (event names, hosts, run ids, layers)."""

E = TypeVar("E", bound="Event")


@dataclasses.dataclass(slots=True, kw_only=True)
class Event:
    """Fields every event has. ``ts``: seconds since the epoch (0 when built: ``EventLog.emit``
    stamps it); ``node``/``host``/``pid``/``run_id``/``source``: the writer's, added by its
    ``EventLog``; ``rank``: the global rank of the worker that wrote it, if a worker did.

    A record is a value: nothing changes it once built (``dataclasses.replace`` makes a changed
    copy). It is not a frozen dataclass only because those cost three times as much to build,
    and a report reads millions of them."""

    NAME: ClassVar[str] = ""
    LOGGED: ClassVar[bool] = True
    """False for what is only shown to the user (``Reporter``), never written to the log."""
    NULL_KEPT: ClassVar[frozenset[str]] = frozenset()
    """Own fields written even when null (null means something there); others are left out."""

    ts: float = 0.0
    host: str | None = None
    pid: int | None = None
    node: int | None = None
    run_id: str | None = None
    source: str | None = None
    rank: int | None = None
    v: int = 0
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Fields this version does not define, as read (JSON values)."""

    @property
    def name(self) -> str:
        return self.NAME

    @property
    def by_launcher(self) -> bool:
        return self.source == "launcher"

    @property
    def where(self) -> object:
        """The node that wrote it (its host name in logs without node numbers)."""
        return self.node if self.node is not None else self.host

    def fields(self) -> dict[str, Any]:
        """The record's own fields (not the common ones) that are set, as JSON values."""
        out = {}
        for attr, key in _OWN[type(self)]:
            value = getattr(self, attr)
            if value is not None or attr in self.NULL_KEPT:
                out[key] = list(value) if isinstance(value, tuple) else value
        return {**out, **self.extra}

    def as_dict(self) -> dict[str, Any]:
        """The event as the log holds it (``ts``, ``event``, ``v``, common and own fields)."""
        out: dict[str, Any] = {"ts": self.ts, "event": self.name, "v": self.v}
        for attr in _COMMON:
            value = getattr(self, attr)
            if value is not None:
                out[attr] = value
        return {**out, **self.fields()}


@dataclass_transform(kw_only_default=True, field_specifiers=(dataclasses.field,))
def _event(name: str, *, logged: bool = True) -> Callable[[type[E]], type[E]]:
    """Class decorator: a record named ``name`` in the log, registered for parsing."""

    def register(cls: type[E]) -> type[E]:
        made = dataclasses.dataclass(slots=True, kw_only=True)(cls)
        made.NAME = name
        made.LOGGED = logged
        EVENT_TYPES[name] = made
        return made

    return register


EVENT_TYPES: dict[str, type[Event]] = {}
"""Every record type by its name in the log."""


# -- worker events --------------------------------------------------------------------------


@_event("worker_start")
class WorkerStart(Event):
    """A worker process started (before its first in-process attempt)."""

    restart_count: int | None = None
    """ft_launcher's restart round (``TORCHELASTIC_RESTART_COUNT``): 0 for the first processes."""
    warm: bool | None = None
    """Forked from the warm-start server (``[job] warm_start``); its ``pid`` is then the one
    ft_launcher knows (the client's)."""


@_event("attempt_start")
class AttemptStart(Event):
    """An in-process attempt starts (NVRx ``Wrapper`` iteration)."""

    world: int | None = None
    iteration: int | None = None
    restart_count: int | None = None


@_event("step")
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


@_event("fault_injected")
class FaultInjected(Event):
    step: int | None = None
    kind: str | None = None


@_event("object_reused")
class ObjectReused(Event):
    key: str | None = None
    iteration: int | None = None


@_event("worker_stopped")
class WorkerStopped(Event):
    """A worker told to stop (SIGTERM from ft_launcher) is about to exit."""

    signal: str | None = None
    forced: bool | None = None
    waited_s: float | None = None


@_event("worker_gave_up")
class WorkerGaveUp(Event):
    """The in-process layer gave up; the fault goes to ft_launcher."""

    reason: str | None = None


@_event("worker_thread_error")
class WorkerThreadError(Event):
    thread: str | None = None
    error: str | None = None


@_event("restart_begin")
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


@_event("restart_end")
class RestartEnd(Event):
    layer: str | None = None
    iteration: int | None = None
    ts_mono: float | None = None


# -- checkpoints ----------------------------------------------------------------------------


@_event("checkpoint_begin")
class CheckpointBegin(Event):
    step: int | None = None
    waited_for_previous_s: float | None = None


@_event("checkpoint_staged")
class CheckpointStaged(Event):
    """A save's copy is taken: the training loop goes on (``blocked_s`` is what it waited)."""

    step: int | None = None
    blocked_s: float | None = None
    stage_s: float | None = None
    write_s: float | None = None
    """Sync saves only: the write, inside ``blocked_s``."""
    bytes: int | None = None
    is_async: bool | None = dataclasses.field(default=None, metadata={"key": "async"})


@_event("checkpoint_committed")
class CheckpointCommitted(Event):
    step: int | None = None
    write_s: float | None = None
    bytes: int | None = None


@_event("checkpoint_already_committed")
class CheckpointAlreadyCommitted(Event):
    """The step's checkpoint was already on storage, verified (an earlier attempt saved it)."""

    step: int | None = None
    path: str | None = None


@_event("checkpoint_settled")
class CheckpointSettled(Event):
    """A save in flight at a fault was finished or dropped."""

    step: int | None = None
    waited_s: float | None = None
    finished: bool | None = None
    limit_s: float | None = None


@_event("checkpoint_replicated")
class CheckpointReplicated(Event):
    """A rank's host copy of ``step`` was sent to the rank that keeps it on another pod (and that
    pod's copy of another rank received), in the background after the save."""

    step: int | None = None
    to_rank: int | None = None
    from_rank: int | None = None
    sent_bytes: int | None = None
    received_bytes: int | None = None
    seconds: float | None = None
    error: str | None = None
    """Why the exchange failed (the peer copies of this attempt are then off)."""


@_event("checkpoint_restored")
class CheckpointRestored(Event):
    step: int | None = None
    origin: str | None = None
    """``storage``, ``memory`` (this pod's host copy) or ``peer`` (the copy another pod kept)."""
    seconds: float | None = None
    bytes: int | None = None
    memory_problem: str | None = None
    """Why a storage restore did not use the host copy that ``nvtrain run`` keeps in memory."""

    @property
    def from_storage(self) -> bool:
        # Logs before ``origin`` named it ``source`` (which the writer's common field now is).
        return self.origin == "storage" or (self.origin is None and self.source == "storage")


@_event("checkpoint_partial")
class CheckpointPartial(Event):
    step: int | None = None
    path: str | None = None


@_event("checkpoint_corrupt")
class CheckpointCorrupt(Event):
    step: int | None = None
    path: str | None = None
    problem: str | None = None


@_event("checkpoint_rejected")
class CheckpointRejected(Event):
    """A step folder found damaged or forged, moved aside (``moved_to``) so it is never used."""

    step: int | None = None
    path: str | None = None
    moved_to: str | None = None
    problem: str | None = None
    """What was wrong, naming the file: ``extra-rank1.pt does not match its manifest's digest
    (found by rank 1)``, ``the .metadata names a class that is not allowed: posix.system``."""
    error: str | None = None
    """Why it could not be moved aside (a read-only volume); it is skipped all the same."""

    @property
    def text(self) -> str:
        """The event in one line: ``step 120: <problem>; moved to <path>``."""
        where = f"moved to {self.moved_to}" if self.moved_to else f"left in place ({self.error})"
        return f"step {self.step}: {self.problem or 'no reason given'}; {where}"


@_event("checkpoint_failed")
class CheckpointFailed(Event):
    step: int | None = None
    error: str | None = None
    errno: str | None = None
    """The error's errno name (``ENOSPC``), when it has one."""
    ranks: tuple[int, ...] | None = None
    path: str | None = None
    failed_in_a_row: int | None = None


# -- launcher events ------------------------------------------------------------------------


@_event("launcher_start")
class LauncherStart(Event):
    argv: tuple[str, ...] | None = None
    endpoint: str | None = None
    is_host: bool | None = None
    metrics_port: int | None = None


@_event("launcher_started")
class LauncherStarted(Event):
    """ft_launcher was started (again, after ``relaunch``)."""

    launcher_pid: int | None = None


@_event("launcher_exit")
class LauncherExit(Event):
    exit_code: int | None = None
    cause: str | None = None

    @property
    def failed(self) -> bool:
        return self.exit_code not in (0, None)


@_event("relaunch")
class Relaunch(Event):
    layer: str | None = None
    reason: str | None = None
    attempt: int | None = None


@_event("killed_leftovers")
class KilledLeftovers(Event):
    pids: tuple[int, ...] | None = None


@_event("escalated")
class Escalated(Event):
    """nvtrain decided that the failures repeat without progress and stops the run (exit 4):
    ft_launcher is frozen at once, so that no new round starts, and its tree is stopped."""

    reason: str | None = None
    failures: int | None = None
    """Failures counted in a row when it decided."""
    error: str | None = None
    """The script's error (the last line of its traceback), when known; a failure before the first
    step that repeated with the same error stops the run before ``[restart] escalate_after``."""


@_event("hang_blamed")
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


@_event("signal")
class SignalReceived(Event):
    """``nvtrain run`` received a signal it forwards (the pod is being stopped)."""

    signal: str | None = None


@_event("dns_resolved")
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


@_event("worker_failed")
class WorkerFailed(WorkerExit):
    """A worker failed: a fault. Logs from before ``worker_ended`` logged a worker that had been
    told to stop as a ``worker_failed`` with ``stopped: true``; it reads as a ``WorkerEnded``."""


@_event("worker_ended")
class WorkerEnded(WorkerExit):
    """A worker ended because it was asked to (``reason``), with an error status: no fault, never
    the root cause, not counted for escalation."""

    reason: str | None = None
    """``stopped``: it had been told to stop: it logged ``worker_stopped`` (ft_launcher stopping the
    workers for a restart, a SIGTERM from outside), or ``nvtrain run`` was stopping the job."""


@_event("hang_detected")
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


@_event("launcher_error")
class LauncherError(Event):
    message: str | None = None
    error: str | None = None
    """The exception's class name (``RendezvousTimeoutError``), when the message names one."""


@_event("rendezvous_done")
class RendezvousDone(Event):
    round: int | None = None
    group_rank: int | None = None
    nodes: int | None = None


# -- shown only (the launcher's ``Reporter``), never logged -------------------------------------


@_event("dns_wait", logged=False)
class DnsWait(Event):
    target: str | None = dataclasses.field(default=None, metadata={"key": "name"})
    error: str | None = None
    waited: float | None = None


@_event("launcher_output_error", logged=False)
class LauncherOutputError(Event):
    error: str | None = None


@_event("events_log_error", logged=False)
class EventsLogError(Event):
    path: str | None = None
    error: str | None = None


@_event("events_log_resumed", logged=False)
class EventsLogResumed(Event):
    path: str | None = None
    dropped: int | None = None


@_event("termination_log_error", logged=False)
class TerminationLogError(Event):
    path: str | None = None
    error: str | None = None
    variable: str | None = None


@_event("metrics_linger", logged=False)
class MetricsLinger(Event):
    """The run has ended; its final figures are served on ``port`` for ``seconds`` more
    (``[metrics] linger``), or until a signal."""

    port: int | None = None
    seconds: float | None = None


@dataclasses.dataclass(slots=True, kw_only=True)
class OtherEvent(Event):
    """An event this version does not define (a newer writer's): its fields are in ``extra``."""

    event: str = ""

    @property
    def name(self) -> str:
        return self.event


# -- parsing ----------------------------------------------------------------------------------

_COMMON = ("host", "pid", "node", "run_id", "source", "rank")
_STOPPED = {"reason": "stopped"}
_RESERVED = frozenset({"ts", "event", "v"})


class _Invalid(Exception):
    pass


def _int(value: object) -> int | None:
    if type(value) is int:
        if -MAX_NUMBER <= value <= MAX_NUMBER:
            return value
        raise _Invalid
    if value is None or (type(value) is float and -MAX_NUMBER <= value <= MAX_NUMBER):
        return None  # a fraction in an integer field carries nothing usable
    raise _Invalid  # a string, a bool, NaN, or out of range


def _float(value: object) -> float | None:
    if type(value) is float or type(value) is int:
        if -MAX_NUMBER <= value <= MAX_NUMBER:  # False for NaN
            return float(value)
        raise _Invalid
    if value is None:
        return None
    raise _Invalid


def _str(value: object) -> str | None:
    if type(value) is str:
        return sys.intern(value) if len(value) <= _INTERNED else value
    if value is None:
        return None
    if type(value) is list or type(value) is dict:
        raise _Invalid
    return str(value)


def _bool(value: object) -> bool | None:
    return value if type(value) is bool else None


def _strs(value: object) -> tuple[str, ...] | None:
    if type(value) is not list or any(type(v) is not str for v in value):
        return None
    return tuple(value)


def _ints(value: object) -> tuple[int, ...] | None:
    if type(value) is not list or any(type(v) is not int for v in value):
        return None
    return tuple(value)


_CONVERTERS: dict[str, Callable[[object], object]] = {
    "int | None": _int,
    "int": _int,
    "float | None": _float,
    "float": _float,
    "str | None": _str,
    "str": _str,
    "bool | None": _bool,
    "tuple[str, ...] | None": _strs,
    "tuple[int, ...] | None": _ints,
}
_BASE = {f.name for f in dataclasses.fields(Event)}
_OWN: dict[type[Event], tuple[tuple[str, str], ...]] = {}
"""Per record type: (attribute, key in the log) of its own fields."""
_SPEC: dict[type[Event], dict[str, tuple[str, Callable[[object], object]]]] = {}
"""Per record type: key in the log -> (attribute, converter), common fields included."""


def _spec(cls: type[Event]) -> None:
    own, spec = [], {}
    for f in dataclasses.fields(cls):
        if f.name in ("extra", "v", "ts") or (cls is OtherEvent and f.name == "event"):
            continue
        convert = _CONVERTERS.get(str(f.type))
        if convert is None:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported field type {f.type}")
        key = f.metadata.get("key", f.name)
        spec[key] = (f.name, convert)
        if f.name not in _BASE:
            own.append((f.name, key))
    _OWN[cls] = tuple(own)
    _SPEC[cls] = spec


for _cls in (*EVENT_TYPES.values(), OtherEvent, Event):
    _spec(_cls)


def from_fields(record: Mapping[str, Any]) -> Event | None:
    """The typed event of one JSON object from a log; None when it is not a valid event: no
    finite ``ts``, no string ``event``, or a field of the wrong type (see the module's doc)."""
    stamp = record.get("ts")
    if (type(stamp) is not float and type(stamp) is not int) or not -MAX_NUMBER <= stamp <= MAX_NUMBER:
        return None
    name = record.get("event")
    if type(name) is not str:
        return None
    cls = EVENT_TYPES.get(name, OtherEvent)
    if cls is WorkerFailed and record.get("stopped") is True:  # logged before worker_ended
        cls, record = WorkerEnded, {k: v for k, v in record.items() if k != "stopped"} | _STOPPED
    spec = _SPEC[cls]
    version = record.get("v")
    values: dict[str, Any] = {"ts": float(stamp), "v": version if type(version) is int else 0}
    extra: dict[str, Any] = {}
    try:
        for key, value in record.items():
            known = spec.get(key)
            if known is not None:
                values[known[0]] = known[1](value)
            elif key not in _RESERVED:
                extra[sys.intern(key)] = value
    except _Invalid:
        return None
    if cls is OtherEvent:
        values["event"] = sys.intern(name)
    if extra:
        values["extra"] = extra
    return cls(**values)

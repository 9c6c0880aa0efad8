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

This module is the one place to import records from (``from nvtrain.events.records import
Step``), and the parser (``from_fields``). The definitions live by writer: ``base`` (the
``Event`` base, the registry and the field types), ``worker_events``, ``checkpoint_events``
and ``launcher_events`` (what ``nvtrain run`` logs, reads from ft_launcher, or only shows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvtrain.events.base import (
    EVENT_TYPES,
    MAX_NUMBER,
    SCHEMA_VERSION,
    Event,
    OtherEvent,
    build,
)
from nvtrain.events.checkpoint_events import (
    CheckpointAlreadyCommitted,
    CheckpointBegin,
    CheckpointCommitted,
    CheckpointCorrupt,
    CheckpointFailed,
    CheckpointPartial,
    CheckpointRejected,
    CheckpointReplicated,
    CheckpointRestored,
    CheckpointSettled,
    CheckpointStaged,
)
from nvtrain.events.launcher_events import (
    DnsResolved,
    DnsWait,
    Escalated,
    EventsLogError,
    EventsLogResumed,
    HangBlamed,
    HangDetected,
    KilledLeftovers,
    LauncherError,
    LauncherExit,
    LauncherOutputError,
    LauncherStart,
    LauncherStarted,
    MetricsLinger,
    Relaunch,
    RendezvousDone,
    SignalReceived,
    TerminationLogError,
    WorkerEnded,
    WorkerExit,
    WorkerFailed,
)
from nvtrain.events.worker_events import (
    AttemptStart,
    FaultInjected,
    ObjectReused,
    RestartBegin,
    RestartEnd,
    Step,
    WorkerGaveUp,
    WorkerStart,
    WorkerStopped,
    WorkerThreadError,
)

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

_STOPPED = {"reason": "stopped"}


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
    return build(cls, name, float(stamp), record)

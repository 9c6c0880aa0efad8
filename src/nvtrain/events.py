"""The run's events log (JSON lines, append-only), written by the launcher and the workers.

Each line is written with one ``write`` call on an O_APPEND descriptor, so processes on one node
can share the file without interleaving lines. Readers skip a torn last line, and skip and count
every other line that is not a valid event (``parse_event``), so no line can crash them.

A full or failing volume must not stop whoever writes: an ``EventLog`` with a ``report``
callback reports the first failed write of a streak, drops events until a write succeeds again
(space may come back), then reports how many it dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_NUMBER",
    "EventLog",
    "EventTail",
    "Events",
    "integer",
    "is_event",
    "number",
    "parse_event",
    "read_events",
]


class EventLog:
    """Appends events to one file; safe to share between processes on one node (O_APPEND).

    Without ``report`` (set it after construction), a failed write raises ``OSError``. With
    it, ``emit`` never does: the first failure of a streak is reported as
    ``("events_log_error", {"path", "error"})``, events are dropped while writes fail, and the
    first write that succeeds again is followed by ``("events_log_resumed", {"path",
    "dropped"})``. A line cut short by a full volume is ended before the next one is written,
    so readers skip it alone.
    """

    def __init__(self, path: Path, **common: Any) -> None:
        self.path = path
        self.common = {"host": socket.gethostname(), "pid": os.getpid(), **common}
        self.report: Callable[[str, dict[str, Any]], None] | None = None
        self.dropped = 0
        """Events dropped since the last write that succeeded (with ``report`` only)."""
        self._torn = False
        self._lock = threading.RLock()  # re-entrant: a signal handler may emit during an emit
        path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"ts": round(time.time(), 6), "event": event, **self.common, **fields}
        line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                self._append(b"\n" + line if self._torn else line)
            except OSError as exc:
                if self.report is None:
                    raise
                if self.dropped == 0:
                    self._tell("events_log_error", error=f"{exc.strerror or exc} (errno {exc.errno})")
                self.dropped += 1
                return record
            if self.dropped:
                self._tell("events_log_resumed", dropped=self.dropped)
                self.dropped = 0
        return record

    def _append(self, data: bytes) -> None:
        """Write ``data`` at the end of the file (one ``write`` unless the volume is full)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError:
            if written:  # part of the line made it: the next write must end it first
                self._torn = not data[:written].endswith(b"\n")
            raise
        finally:
            os.close(fd)
        self._torn = False

    def _tell(self, event: str, **fields: Any) -> None:
        assert self.report is not None
        with contextlib.suppress(OSError):  # the reporter's own output may be failing too
            self.report(event, {"path": str(self.path), **fields})


MAX_NUMBER = 1e15
"""Largest magnitude of a number in a field the readers use (times, durations, steps, ranks):
anything larger is no real value, and sums of such numbers would overflow to infinity."""

_NUMBERS = frozenset(
    {
        "ts",
        "step",
        "step_s",
        "blocked_s",
        "waited_for_previous_s",
        "write_s",
        "seconds",
        "waited_s",
        "exit_code",
        "world",
        "rank",
        "local_rank",
        "restart_count",
        "iteration",
        "attempts_left",
        "attempt",
        "pid",
        "worker_pid",
    }
)
"""Fields that are numbers (or null) wherever they appear; ``ts`` must be one."""
_SCALARS = frozenset(
    {"node", "host", "path", "layer", "kind", "cause", "signal", "origin", "source", "run_id"}
)
"""Fields used as names or keys: a string, number, boolean or null, never a list or an object."""
_INTERNED = 64
"""String values up to this length are interned (event names, hosts, run ids, layers)."""


def number(value: object) -> float | None:
    """``value`` as a float when it is a finite number within ``MAX_NUMBER`` (not a bool)."""
    if type(value) is float or type(value) is int:
        return float(value) if -MAX_NUMBER <= value <= MAX_NUMBER else None  # False for NaN
    return None


def integer(value: object) -> int | None:
    """``value`` when it is an integer within ``MAX_NUMBER`` (not a bool)."""
    return value if type(value) is int and -MAX_NUMBER <= value <= MAX_NUMBER else None


def is_event(record: object) -> bool:
    """Whether ``record`` is an event the readers can use: an object with a finite ``ts``, a
    string ``event``, a finite number (or null) in each numeric field they read and no list or
    object in a field they use as a name."""
    return isinstance(record, dict) and _checked(record, intern=False) is not None


def parse_event(line: str | bytes) -> dict[str, Any] | None:
    """The event on one line of a log, its keys and short strings interned (a long log is kept
    in about a third of the memory); None when the line is not a valid event (``is_event``).
    Never raises: a 4,300-digit number (``ValueError``) or thousands of nested brackets
    (``RecursionError``) make a line invalid like any other malformed JSON."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, int digits
        return None
    return _checked(record, intern=True) if type(record) is dict else None


def _checked(record: dict[Any, Any], *, intern: bool) -> dict[str, Any] | None:
    """``record`` when it is a valid event (with ``intern``: a copy, keys and short strings
    interned), else None. One pass over its fields: this runs for every line of a log."""
    stamp = record.get("ts")
    if (type(stamp) is not float and type(stamp) is not int) or not -MAX_NUMBER <= stamp <= MAX_NUMBER:
        return None
    if type(record.get("event")) is not str:
        return None
    out: dict[str, Any] = {}
    for key, value in record.items():
        kind = type(value)
        if key in _NUMBERS:
            if value is not None and (
                (kind is not float and kind is not int) or not -MAX_NUMBER <= value <= MAX_NUMBER
            ):
                return None  # also NaN, which no comparison holds for
        elif (kind is list or kind is dict) and key in _SCALARS:
            return None
        if intern:
            out[sys.intern(key)] = sys.intern(value) if kind is str and len(value) <= _INTERNED else value
    return out if intern else record


class Events(list[dict[str, Any]]):
    """The events read from a log, every one valid (``is_event``: analyses need not check them
    again), and how many complete lines were skipped as not valid."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped = 0
        """Complete lines that were not valid events (``is_event``); blank lines do not count."""


def read_events(path: Path) -> Events:
    """Every valid event in ``path`` (``parse_event``), in file order; ``skipped`` counts the
    complete lines that were not. A torn last line (no newline: the writer was killed, or is
    writing it now) is skipped without being counted."""
    events = Events()
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            record = parse_event(line)
            if record is not None:
                events.append(record)
            elif line.endswith("\n") and line.strip():
                events.skipped += 1
    return events


class EventTail:
    """Reads the events appended to ``path`` since the last call (the file may not exist yet);
    ``skipped`` counts the complete lines so far that were not valid events (``parse_event``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.skipped = 0

    def poll(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()
        events = []
        for line in lines:
            record = parse_event(line)
            if record is not None:
                events.append(record)
            elif line.strip():
                self.skipped += 1
        return events

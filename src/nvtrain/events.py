"""The run's events log (JSON lines, append-only), written by the launcher and the workers.

Each line is written with one ``write`` call on an O_APPEND descriptor, so processes on one node
can share the file without interleaving lines. Readers skip a torn last line.

A full or failing volume must not stop whoever writes: an ``EventLog`` with a ``report``
callback reports the first failed write of a streak, drops events until a write succeeds again
(space may come back), then reports how many it dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["EventLog", "EventTail", "read_events"]


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


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete event in ``path``; a torn last line (writer killed) is skipped."""
    events = []
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                events.append(record)
    return events


class EventTail:
    """Reads the events appended to ``path`` since the last call (the file may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

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
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(record, dict):
                events.append(record)
        return events

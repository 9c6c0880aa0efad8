"""The run's events log (JSON lines, append-only), written by the launcher and the workers.

Each line is written with one ``write`` call on an O_APPEND descriptor, so processes on one node
can share the file without interleaving lines. Readers skip a torn last line.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

__all__ = ["EventLog", "EventTail", "read_events"]


class EventLog:
    """Appends events to one file; safe to share between processes on one node (O_APPEND)."""

    def __init__(self, path: Path, **common: Any) -> None:
        self.path = path
        self.common = {"host": socket.gethostname(), "pid": os.getpid(), **common}
        path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"ts": round(time.time(), 6), "event": event, **self.common, **fields}
        line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return record


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

"""Reading the run's events log into typed records (``nvtrain.events.records``).

Readers skip a torn last line (its writer was killed, or is writing it now), and skip and count
every other line that is not a valid event, so no line can crash them.
"""

from __future__ import annotations

import json
from pathlib import Path

from nvtrain.events.records import Event, from_fields

__all__ = ["EventTail", "Events", "parse_event", "read_events"]


def parse_event(line: str | bytes) -> Event | None:
    """The event on one line of a log; None when the line is not a valid event
    (``records.from_fields``). Never raises: a 4,300-digit number (``ValueError``) or thousands
    of nested brackets (``RecursionError``) make a line invalid like any other malformed JSON."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, int digits
        return None
    return from_fields(record) if type(record) is dict else None


class Events(list[Event]):
    """The events read from a log, in file order, and how many complete lines were skipped as
    not valid events (blank lines do not count)."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped = 0


def read_events(path: Path) -> Events:
    """Every valid event in ``path`` (``parse_event``), in file order."""
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
    ``skipped`` counts the complete lines so far that were not valid events."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.skipped = 0

    def poll(self) -> list[Event]:
        try:
            if self.path.stat().st_size == self.offset:
                return []  # nothing new: no need to open it (a shared volume's round trip)
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        events = []
        for line in lines:
            record = parse_event(line)
            if record is not None:
                events.append(record)
            elif line.strip():
                self.skipped += 1
        return events

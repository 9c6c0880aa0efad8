"""Finding and reading a run's events log: a run directory or its ``events.jsonl``."""

from __future__ import annotations

from pathlib import Path

from nvtrain.errors import UsageError
from nvtrain.events.read import Events, read_events

__all__ = ["EVENTS_FILE", "events_file", "read_log"]

EVENTS_FILE = "events.jsonl"
"""Name of the events log in a run directory (``<checkpoint dir>/<run id>/``)."""


def events_file(path: Path, what: str = "--from-run") -> Path:
    """The events log at ``path``: the file itself, or ``events.jsonl`` in a run directory.
    ``what`` (the option or argument that named it) starts the error message."""
    target = path / EVENTS_FILE if path.is_dir() else path
    if not target.is_file():
        where = f"{path} has no {EVENTS_FILE}" if path.is_dir() else f"{path} does not exist"
        raise UsageError(
            f"{what}: {where}",
            f"give a run directory (<checkpoint dir>/<run id>) or its {EVENTS_FILE}",
        )
    return target


def read_log(path: Path, what: str = "--from-run") -> tuple[Path, Events]:
    """The events log at ``path`` (a file or a run directory) and its valid events (``skipped``
    counts the lines that were not); ``UsageError`` naming the file when it is missing,
    unreadable or holds no valid event."""
    target = events_file(path, what)
    try:
        events = read_events(target)
    except OSError as exc:
        raise UsageError(
            f"{what}: {target} cannot be read ({exc.strerror or exc})",
            "check the path and its permissions",
        ) from None
    if not events:
        skipped = events.skipped
        why = (
            f" with a time stamp and a name ({skipped} line{'s' if skipped != 1 else ''} skipped: an event "
            "is a JSON object with a finite number `ts`, a string `event` and numbers in its numeric fields)"
            if skipped
            else ""
        )
        raise UsageError(
            f"{what}: {target} holds no events{why}",
            f"give the {EVENTS_FILE} that `nvtrain run` wrote in the run directory",
        )
    return target, events

"""Finding and reading a run's events log: one file per pod in the run directory.

Every pod's launcher and workers append to ``events-node<N>.jsonl`` (``pod_events_file``) in the
run directory (``<checkpoint dir>/<run id>``): appends from one machine are whole lines, while
appends from several NFS clients to one file are not. Readers merge every pod's file;
``events.jsonl``, the one shared file that earlier versions wrote, is read too.
"""

from __future__ import annotations

import re
from pathlib import Path

from nvtrain.errors import UsageError
from nvtrain.events.read import Events, EventTail, read_events
from nvtrain.events.records import Event

__all__ = ["EVENTS_FILE", "POD_EVENTS", "RunTail", "log_files", "pod_events_file", "pod_files", "read_log"]

EVENTS_FILE = "events.jsonl"
"""The run's single events log as versions before per-pod files wrote it (still read)."""

POD_EVENTS = "events-node{node}.jsonl"
"""Name of one pod's events log in the run directory."""

_POD_FILE = re.compile(r"events-node([0-9]+)\.jsonl")

_FIX = "give a run directory (<checkpoint dir>/<run id>) or one of the events-node<N>.jsonl files in it"


def pod_events_file(run_dir: Path, node: int) -> Path:
    """The events log of node ``node`` in ``run_dir``."""
    return run_dir / POD_EVENTS.format(node=node)


def pod_files(run_dir: Path) -> list[Path]:
    """The events logs in ``run_dir``: ``events.jsonl`` (older runs) first, then each pod's by
    node rank; [] when there are none (yet)."""
    found = []
    for path in run_dir.iterdir() if run_dir.is_dir() else ():
        match = _POD_FILE.fullmatch(path.name)
        if match and path.is_file():
            found.append((int(match.group(1)), path))
    legacy = [run_dir / EVENTS_FILE] if (run_dir / EVENTS_FILE).is_file() else []
    return legacy + [path for _, path in sorted(found)]


def log_files(path: Path, what: str = "--from-run") -> list[Path]:
    """The events logs at ``path``: the file itself, or every pod's log in a run directory.
    ``UsageError`` (starting with ``what``, the option or argument that named it) when none is
    there."""
    if path.is_dir():
        files = pod_files(path)
        if not files:
            raise UsageError(f"{what}: {path} has no events log (events-node<N>.jsonl)", _FIX)
        return files
    if not path.is_file():
        raise UsageError(f"{what}: {path} does not exist", _FIX)
    return [path]


def read_log(path: Path, what: str = "--from-run") -> tuple[Path, Events]:
    """The events log at ``path`` (a file or a run directory, whose pods' logs are merged) and
    its valid events (``skipped`` counts the lines that were not), in file order: ``RunLog``
    orders them in time. The path returned names the one file read, else ``path``.
    ``UsageError`` naming the file when it is missing, unreadable or holds no valid event."""
    events = Events()
    files = log_files(path, what)
    for target in files:
        try:
            read = read_events(target)
        except OSError as exc:
            raise UsageError(
                f"{what}: {target} cannot be read ({exc.strerror or exc})",
                "check the path and its permissions",
            ) from None
        events.extend(read)
        events.skipped += read.skipped
    if not events:
        skipped = events.skipped
        why = (
            f" with a time stamp and a name ({skipped} line{'s' if skipped != 1 else ''} skipped: an event "
            "is a JSON object with a finite number `ts`, a string `event` and numbers in its numeric fields)"
            if skipped
            else ""
        )
        raise UsageError(
            f"{what}: {path} holds no events{why}",
            "give the run directory that `nvtrain run` wrote (<checkpoint dir>/<run id>)",
        )
    return (files[0] if len(files) == 1 else path), events


class RunTail:
    """What the pods appended to their events logs since the last ``poll``: every pod's log in
    the run directory ``path`` (a pod's log is picked up when it appears), or the one log file
    ``path`` when its name ends in ``.jsonl``. ``skipped`` counts the complete lines so far that
    were not valid events. A log that did not grow costs one ``stat``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tails: dict[Path, EventTail] = {}

    @property
    def skipped(self) -> int:
        return sum(tail.skipped for tail in self._tails.values())

    def poll(self) -> list[Event]:
        files = [self.path] if self.path.suffix == ".jsonl" else pod_files(self.path)
        events: list[Event] = []
        for path in files:
            tail = self._tails.get(path)
            if tail is None:
                tail = self._tails[path] = EventTail(path)
            events.extend(tail.poll())
        return events

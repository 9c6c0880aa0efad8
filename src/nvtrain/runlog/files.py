"""Finding and reading a run's events log: one file per pod in the run directory.

Every pod's launcher and workers append to ``events-node<N>.jsonl`` (``pod_events_file``) in the
run directory (``<checkpoint dir>/<run id>``): appends from one machine are whole lines, while
appends from several NFS clients to one file are not. Readers merge every pod's file;
``events.jsonl``, the one shared file that earlier versions wrote, is read too.

A log holds one run: events that carry another run's id (a log of another run copied into the
folder) are left out, and ``RunEvents.left_out`` says which lines of which file, and why. Only
regular files are read: a device (``/dev/zero`` never ends), a FIFO (opening it waits for a
writer) or a socket is refused before it is opened.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections import Counter
from pathlib import Path

from nvtrain.errors import UsageError
from nvtrain.events.read import Events, EventTail, parse_event
from nvtrain.events.records import Event

__all__ = [
    "EVENTS_FILE",
    "POD_EVENTS",
    "LeftOut",
    "RunEvents",
    "RunTail",
    "log_files",
    "pod_events_file",
    "pod_files",
    "read_log",
]

EVENTS_FILE = "events.jsonl"
"""The run's single events log as versions before per-pod files wrote it (still read)."""

POD_EVENTS = "events-node{node}.jsonl"
"""Name of one pod's events log in the run directory."""

_POD_FILE = re.compile(r"events-node([0-9]+)\.jsonl")

_FIX = "give a run directory (<checkpoint dir>/<run id>) or one of the events-node<N>.jsonl files in it"

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def pod_events_file(run_dir: Path, node: int) -> Path:
    """The events log of node ``node`` in ``run_dir``."""
    return run_dir / POD_EVENTS.format(node=node)


def pod_files(run_dir: Path) -> list[Path]:
    """The events logs in ``run_dir``: ``events.jsonl`` (older runs) first, then each pod's by
    node rank; [] when there are none (yet). Only regular files count."""
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
    there: the path does not exist, is neither a folder nor a regular file (a device, a FIFO),
    cannot be read, or is a folder without an events log."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UsageError(f"{what}: {path} does not exist", _FIX) from None
    except OSError as exc:
        raise _unreadable(what, path, exc) from None
    if stat.S_ISDIR(mode):
        try:
            files = pod_files(path)
        except OSError as exc:
            raise _unreadable(what, path, exc) from None
        if not files:
            raise UsageError(f"{what}: {path} has no events log (events-node<N>.jsonl)", _FIX)
        return files
    if not stat.S_ISREG(mode):
        raise UsageError(
            f"{what}: {path} is not a run directory nor an events log: it is {_kind(mode)}, "
            "which is not read (it could block or never end)",
            _FIX,
        )
    return [path]


def _unreadable(what: str, path: Path, exc: OSError) -> UsageError:
    return UsageError(
        f"{what}: {path} cannot be read ({exc.strerror or exc})", "check the path and its permissions"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class LeftOut:
    """The events of another run found in one file of the log: left out of this run's."""

    file: Path
    run_id: str
    """Their run id."""
    lines: tuple[tuple[int, int], ...]
    """Where they are: (first, last) line numbers of each stretch of them, from 1."""
    events: int
    """How many events were left out."""
    whole_file: bool
    """Every event of the file was left out (a log of another run)."""

    def where(self, limit: int = 5) -> str:
        """``lines 3-40, 52`` (the first ``limit`` stretches, then how many more)."""
        shown = [f"{a}" if a == b else f"{a}-{b}" for a, b in self.lines[:limit]]
        more = len(self.lines) - limit
        text = ", ".join(shown) + (f" and {more} more stretch{'es' if more != 1 else ''}" if more > 0 else "")
        return ("line " if len(self.lines) == 1 and self.lines[0][0] == self.lines[0][1] else "lines ") + text


class RunEvents(Events):
    """The events read from a run's log (``read_log``): this run's only, in file order.
    ``run_id``: the run's id (None when no event carries one); ``chosen_by``: why that one, in
    words; ``left_out``: the events of other runs that were found, per file."""

    def __init__(self) -> None:
        super().__init__()
        self.run_id: str | None = None
        self.chosen_by = ""
        self.left_out: list[LeftOut] = []

    def warnings(self) -> list[str]:
        """One line per file with events of another run: which, where, and why left out."""
        lines = []
        for gone in self.left_out:
            count = f"{gone.events} event{'s' if gone.events != 1 else ''}"
            whole = f"all its {count}" if gone.whole_file else count
            lines.append(
                f"{gone.file}: {whole} left out ({gone.where()}): they belong to run {gone.run_id!r}, "
                f"not to run {self.run_id!r} (chosen by {self.chosen_by}); move the file to that run's folder"
            )
        return lines


def read_log(path: Path, what: str = "--from-run") -> tuple[Path, RunEvents]:
    """The events log at ``path`` (a file or a run directory, whose pods' logs are merged) and
    its valid events (``skipped`` counts the lines that were not), in file order: ``RunLog``
    orders them in time. The path returned names the one file read, else ``path``.

    Only one run's events are kept (``RunEvents.left_out`` lists the others'): the run whose id
    is the run directory's name (a file's folder, when a file is given), else the run most
    events belong to. Events without a run id are kept. ``UsageError`` naming the file when it
    is missing, not a regular file, unreadable or holds no valid event."""
    read: list[tuple[Path, list[tuple[int, Event]], int]] = []
    for target in log_files(path, what):
        try:
            numbered, skipped = _numbered_events(target, what)
        except OSError as exc:
            raise _unreadable(what, target, exc) from None
        read.append((target, numbered, skipped))
    events = RunEvents()
    events.skipped = sum(skipped for _, _, skipped in read)
    counts = Counter(e.run_id for _, numbered, _ in read for _, e in numbered if e.run_id is not None)
    folder = (path if len(read) > 1 or path.is_dir() else path.parent).absolute()
    if folder.name in counts:
        events.run_id, events.chosen_by = folder.name, f"the name of the folder {folder}"
    elif counts:
        events.run_id = counts.most_common(1)[0][0]  # the first seen on a tie
        share = f"{counts[events.run_id]} of {sum(counts.values())}"
        events.chosen_by = f"its share of the events with a run id: {share}"
    for target, numbered, _ in read:
        theirs: dict[str, list[int]] = {}
        for number, event in numbered:
            if event.run_id is None or event.run_id == events.run_id:
                events.append(event)
            else:
                theirs.setdefault(event.run_id, []).append(number)
        for run_id, numbers in theirs.items():
            whole = len(numbers) == len(numbered)
            events.left_out.append(LeftOut(target, run_id, _stretches(numbers), len(numbers), whole))
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
    return (read[0][0] if len(read) == 1 else path), events


def _numbered_events(path: Path, what: str) -> tuple[list[tuple[int, Event]], int]:
    """Every valid event in the regular file ``path`` with its line number (from 1), and how
    many complete lines were not valid events (``nvtrain.events.read_events``' rules). Opened
    without blocking and checked again once open (the path may have changed since it was
    listed): a FIFO or a device is refused, never read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, encoding="utf-8", errors="replace") as handle:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"{what}: {path} is {_kind(mode)}, not an events log", _FIX)
        numbered: list[tuple[int, Event]] = []
        skipped = 0
        for number, line in enumerate(handle, 1):
            record = parse_event(line)
            if record is not None:
                numbered.append((number, record))
            elif line.endswith("\n") and line.strip():
                skipped += 1
    return numbered, skipped


def _stretches(numbers: list[int]) -> tuple[tuple[int, int], ...]:
    """Sorted line numbers as (first, last) stretches of consecutive ones."""
    stretches: list[tuple[int, int]] = []
    for n in numbers:
        if stretches and stretches[-1][1] == n - 1:
            stretches[-1] = (stretches[-1][0], n)
        else:
            stretches.append((n, n))
    return tuple(stretches)


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

"""Reads ft_launcher's output: the log lines nvtrain acts on become events (``parse_line``), the
launcher's own log lines are told apart from the workers' (``LogSorter``), and a worker's uncaught
exception is noticed by the traceback torch.distributed prints for it (``read_raised``).

What NVRx's lines look like in each version (the regexes) is ``nvtrain.nvrx.log_grammar``'s;
this module turns what it recognises into events and decisions."""

from __future__ import annotations

import dataclasses
import re
import signal
import sysconfig

from nvtrain.events.records import (
    Event,
    HangDetected,
    LauncherError,
    RendezvousDone,
    RestartBegin,
    WorkerFailed,
)
from nvtrain.nvrx import log_grammar
from nvtrain.nvrx.log_grammar import OUT_OF_SECTION, RENDEZVOUS_TIMEOUT

__all__ = [
    "OUT_OF_SECTION",
    "RENDEZVOUS_TIMEOUT",
    "LogSorter",
    "PlainTraceback",
    "Raised",
    "caused_by_peer",
    "parse_line",
    "read_line",
    "read_raised",
    "script_frame",
    "signal_name",
]


def signal_name(exit_code: int) -> str | None:
    """``-9`` -> ``"SIGKILL"`` (negative codes are deaths by signal); None otherwise."""
    if exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def parse_line(line: str) -> Event | None:
    """The event for a line of ft_launcher's output that nvtrain acts on (``WorkerFailed``,
    ``RestartBegin``, ``HangDetected``, ``LauncherError``, ``RendezvousDone``), else None."""
    failed = log_grammar.worker_exit(line)
    if failed is not None:
        return WorkerFailed(
            source="launcher",
            local_rank=failed.local_rank,
            worker_pid=failed.pid,
            exit_code=failed.exit_code,
            signal=signal_name(failed.exit_code),
        )
    restart = log_grammar.restart(line)
    if restart is not None:
        return RestartBegin(
            source="launcher",
            layer="in_job",
            attempts_left=restart.attempts_left,
            max_restarts=restart.max_restarts,
        )
    hang = log_grammar.hang(line)
    if hang is not None:
        if hang.rank is not None:  # 0.4: the global rank
            return HangDetected(
                source="launcher", rank=hang.rank, heartbeat=hang.heartbeat, section=hang.section
            )
        return HangDetected(
            source="launcher", local_rank=hang.local_rank, heartbeat=hang.heartbeat, section=hang.section
        )
    error = log_grammar.agent_error(line)
    if error is not None:
        return LauncherError(source="launcher", message=error.message[:500], error=error.error)
    joined = log_grammar.joined(line)
    if joined is not None:
        return RendezvousDone(
            source="launcher", round=joined.round, group_rank=joined.group_rank, nodes=joined.nodes
        )
    return None


read_line = parse_line
"""The same as ``parse_line`` (an earlier name)."""


# -- the launcher's own log lines ---------------------------------------------------------------

# The launchers' log formats and what continues a record (a table, a traceback) are
# ``nvrx/log_grammar.py``'s; which records are shown is decided here.


class LogSorter:
    """Sorts one of ft_launcher's streams, line by line, into the launcher's own log records and
    the rest (the workers' output, Python's warnings, anything else), by the loggers' line
    formats. A record continues on the indented rows of a table that follow it (and the blank
    line that ends the table), or on the traceback logged with it (``Traceback (most recent
    call last):`` right after it, its indented frames, the exception's line, and the tracebacks
    chained to it); any other line is not the launcher's.

    ``sort`` says whether a line is the launcher's and whether it is shown without ``-v``: every
    line that is not the launcher's; the launcher's errors (with their tracebacks), but for
    asyncio's report of a cancelled rank monitor connection (``log_grammar.cancelled_callback``: ft_launcher
    stopping, no failure); its warnings, each message once (NVRx repeats some at every worker
    start). ``seen``: the warnings shown so far, shared by the sorters of one ft_launcher's two
    streams."""

    def __init__(self, seen: set[str] | None = None) -> None:
        self.seen = seen if seen is not None else set()
        self._record: bool | None = None
        """Whether the record being continued is shown (None: no record to continue)."""
        self._rows = False
        self._error_record = False
        """The record being continued is an error (only errors are logged with a traceback: a
        script's traceback right after another record is the script's, ``_traceback``)."""
        self._first_frame = False
        self._trace: str | None = None
        """Where in the record's traceback: "head" (right after the record: a traceback may
        start), "handle" (asyncio's handle line may come first), "frames", "end" (after an
        exception's line: a chained one may follow), None (no traceback can follow)."""

    def sort(self, line: str) -> tuple[bool, bool]:
        """(the launcher's, shown) for the next line of the stream."""
        record = log_grammar.launcher_record(line)
        if record is not None:
            level, message = record.level, record.message
            error = level in log_grammar.ERROR_LEVELS
            warning = level in log_grammar.WARNING_LEVELS
            shown = error or (warning and message not in self.seen)
            if warning:
                self.seen.add(message)
            if log_grammar.cancelled_callback(message):
                shown = False
            self._record, self._rows = shown, False
            self._trace = "handle" if message.startswith(log_grammar.CALLBACK) else "head"
            self._error_record = error
            return True, shown
        if self._record is not None:
            shown = self._record
            if self._traceback(line.rstrip("\r\n")):
                return True, shown
            if log_grammar.table_row(line):
                self._rows = True
                return True, shown
            if self._rows and not line.strip():
                self._record = None
                return True, shown
        self._record = None
        self._trace = None
        return False, True

    def _traceback(self, text: str) -> bool:
        """Whether ``text`` (a line after a record) belongs to the record's traceback."""
        trace, self._trace = self._trace, None
        if trace == "frames":
            first, self._first_frame = self._first_frame, False
            if first and not self._error_record and script_frame(text):
                return False  # a worker's traceback that came right after an INFO record
            self._trace = "frames" if text[:1] in (" ", "\t") else "end"  # else: the exception
            return True
        if trace == "handle" and text.startswith(log_grammar.HANDLE):
            self._trace = "head"
            return True
        if trace is not None and text == log_grammar.TRACEBACK:
            self._trace = "frames"
            self._first_frame = True
            return True
        if trace == "end" and (not text.strip() or text in log_grammar.CHAINED):
            self._trace = "end"
            return True
        return False


# -- a worker's uncaught exception ------------------------------------------------------------

# torch.distributed's excepthook (installed by init_process_group) prints an uncaught exception's
# traceback with "[rank<global rank>]: " before each line, in one write.
_RAISED = re.compile(r"\[rank(\d+)\]: (.*?)\s*$")
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?::\s.*)?")
# What a worker raises when a peer died or hung: gloo's and NCCL's errors, torch's store errors.
_PEER = re.compile(
    r"Connection (?:closed|reset) by peer|Broken pipe|gloo/transport|Timed out waiting|"
    r"\bDist(?:Backend|Network|Store)Error\b|NCCL communicator was aborted|NCCL error|"
    r"collective operation timeout"
)


@dataclasses.dataclass(frozen=True)
class Raised:
    """A line of a worker's traceback: global ``rank``; ``error``, the exception ("RuntimeError:
    boom") on its last line, None on the others."""

    rank: int
    error: str | None


def read_raised(line: str) -> Raised | None:
    """The traceback line (``Raised``) ``line`` is, if it is one torch.distributed printed."""
    match = _RAISED.match(line)
    if match is None:
        return None
    text = match.group(2)
    error = text if _EXCEPTION_LINE.fullmatch(text) else None
    return Raised(int(match.group(1)), error)


def caused_by_peer(error: str) -> bool:
    """Whether exception ``error`` is what a worker raises when a peer died or hung (a broken
    connection, a collective that timed out), rather than a fault of its own."""
    return _PEER.search(error) is not None


# -- a traceback without a rank -----------------------------------------------------------------

_PLAIN_EXCEPTION = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::\s.*)?")
_FRAME = re.compile(r'[ \t]+File "([^"]+)", line \d+')
_LIBRARIES = tuple(
    {
        path
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
)
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/")


def script_frame(line: str) -> bool:
    """Whether ``line`` is a traceback's frame in a file of the script's own (not in Python's
    standard library or an installed package, nor ``<frozen ...>``)."""
    match = _FRAME.match(line)
    if match is None:
        return False
    path = match.group(1)
    if path.startswith("<") or any(part in path for part in _LIBRARY_PARTS):
        return False
    return not any(path.startswith(lib.rstrip("/") + "/") for lib in _LIBRARIES)


class PlainTraceback:
    """Reads Python tracebacks that a worker printed itself (no ``[rank<N>]:`` before its lines:
    an exception raised before ``init_process_group``), one stream's lines at a time: ``feed``
    returns the exception's line (``ValueError: bad value``) when a traceback with at least one
    frame in the script's own files (``script_frame``: not the launcher's, whose frames are all
    in NVRx, torch and the standard library) ends with it. Chained exceptions each end their own
    traceback. Lines of other processes between the frames may end a traceback early: then
    nothing is returned."""

    def __init__(self) -> None:
        self._frames = False
        """Inside a traceback, after its first line."""
        self._script = False
        """One of its frames is in the script's files."""

    def feed(self, line: str) -> str | None:
        text = line.rstrip("\r\n")
        if text == log_grammar.TRACEBACK:
            self._frames, self._script = True, False
            return None
        if not self._frames:
            return None
        if text[:1] in (" ", "\t"):
            self._script = self._script or script_frame(text)
            return None
        self._frames = False
        if not self._script or text.startswith("[rank") or not _PLAIN_EXCEPTION.fullmatch(text):
            return None
        return text.strip()[:500]

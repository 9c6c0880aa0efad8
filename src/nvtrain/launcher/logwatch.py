"""Reads ft_launcher's output: the log lines nvtrain acts on become events (``parse_line``), the
launcher's own log lines are told apart from the workers' (``LogSorter``), and a worker's uncaught
exception is noticed by the traceback torch.distributed prints for it (``read_raised``)."""

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

__all__ = [
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

RENDEZVOUS_TIMEOUT = "RendezvousTimeoutError"
"""The exception ft_launcher ends with when the rendezvous did not gather its nodes within
``join_timeout`` (``error`` of a ``launcher_error`` event)."""

_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
# 0.4 says UNHEALTHY, 0.6/0.7 say FAILED.
_RESTART = re.compile(
    r"Worker group (?:UNHEALTHY|FAILED)\. (\d+)/(\d+) attempts left"
    r"|(\d+)/(\d+) restart attempts left; restarting"  # the second form: min-healthy (0.4)
)
# The rank monitor (one per worker) names it after the host: "RankMonServer<pid>@host:<rank>" (0.4,
# the global rank); 0.6/0.7 log through NVRx's logger: "[workload:<rank>(<local rank>) infra:...]"
# What the monitor missed: a heartbeat, a section open too long (sections API), or too long with
# no section open ("[Cycle N] " before these on 0.6/0.7).
_HANG = re.compile(
    r"(?:RankMonServer\d+@[^:\]]*:(\d+)\]|\[workload:[^(\]]*\((\d+)\) infra:[^\]]*\])"
    r".*(?:Did not get (initial|subsequent) heartbeat|Section '([^']*)' has been open for"
    r"|(Was out of section) for)"
)
OUT_OF_SECTION = "out-of-section"
"""``HangDetected.section`` when no section was open for longer than ``out_of_section_timeout``."""
_AGENT_ERROR = re.compile(r"Agent run ended with exception,? (.*?)\.? Agent's exit code")
# The message is NVRx's f"{e=}": "e=RendezvousTimeoutError()", "e=RendezvousConnectionError('...')"
_ERROR_CLASS = re.compile(r"^e=(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*)\(")
# 0.4: "joined round N of the rendezvous ..."; 0.6/0.7: "joined the rendezvous ..." (no round)
_JOINED = re.compile(
    r"joined (?:round (\d+) of )?the rendezvous '([^']*)' as rank (\d+) in a world of size (\d+)"
)


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
    match = _FAILED.search(line)
    if match:
        code = int(match.group(1))
        return WorkerFailed(
            source="launcher",
            local_rank=int(match.group(2)),
            worker_pid=int(match.group(3)),
            exit_code=code,
            signal=signal_name(code),
        )
    match = _RESTART.search(line)
    if match:
        left, limit = match.group(1, 2) if match.group(1) else match.group(3, 4)
        return RestartBegin(
            source="launcher", layer="in_job", attempts_left=int(left), max_restarts=int(limit)
        )
    match = _HANG.search(line)
    if match:
        section = match.group(4)
        if section is None and match.group(5):
            section = OUT_OF_SECTION
        if match.group(1) is not None:  # 0.4: the global rank
            return HangDetected(
                source="launcher", rank=int(match.group(1)), heartbeat=match.group(3), section=section
            )
        return HangDetected(
            source="launcher", local_rank=int(match.group(2)), heartbeat=match.group(3), section=section
        )
    match = _AGENT_ERROR.search(line)
    if match:
        message = match.group(1)
        kind = _ERROR_CLASS.match(message)
        return LauncherError(source="launcher", message=message[:500], error=kind.group(1) if kind else None)
    match = _JOINED.search(line)
    if match:
        return RendezvousDone(
            source="launcher",
            round=int(match.group(1)) if match.group(1) else None,
            group_rank=int(match.group(3)),
            nodes=int(match.group(4)),
        )
    return None


read_line = parse_line
"""The same as ``parse_line`` (an earlier name)."""


# -- the launcher's own log lines ---------------------------------------------------------------

# A log record of ft_launcher or of its rank monitors, by the logger's line format, with its level:
# NVRx 0.4: "[2026-12-02 09:15:22,261] [INFO] [ft_launcher12528@vm] ...", "[...] [INFO]
#   [RankMonServer12557@vm:1] ...", "[...] [ALWAYS] [RankMonServer.Restarter] ..." (stdout);
# NVRx 0.6/0.7: "2026-12-02 09:16:30,389 [INFO] [vm] [workload:?(?) infra:?(?)] launcher.py:2610 ...";
# torch's elastic agent (0.6/0.7): "E1202 09:16:52.997000 645 torch/distributed/elastic/...:986] ...".
_LAUNCHER_RECORD = re.compile(
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[(?P<a>[A-Z]+)\] "
    r"\[(?:ft_launcher\d+@[^\]]*|RankMonServer[^\]]*)\] "
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[(?P<b>[A-Z]+)\] \[[^\]]*\] \[workload:[^\]]*\] "
    r"|(?P<c>[DIWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ torch/distributed/elastic/[^\]]*\] "
)
_WARNING_LEVELS = frozenset({"WARNING", "W"})
_ERROR_LEVELS = frozenset({"ERROR", "CRITICAL", "FATAL", "E", "F"})
# The rest of a multi-line record: the indented "key : value" or "key=value" rows of a table
# ("Starting elastic_operator with launch configs:", torch's "Rendezvous complete ... Result:").
_TABLE_ROW = re.compile(r"[ \t]+[A-Za-z_][\w ]*?[ \t]*[:=]")
# Or the traceback of a record logged with its exception (``logger.exception``, asyncio's
# "Exception in callback ..." with its "handle: <Handle ...>" line first): its frames are
# indented, and its last line, the exception, is not; chained exceptions follow after a blank line.
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = frozenset(
    {
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    }
)
_CALLBACK = "Exception in callback "
_HANDLE = "handle: <Handle "
# As ft_launcher stops its workers (a stop nvtrain asked for, or a restart), it cancels the rank
# monitors' connection handlers that still hold a connection, and asyncio logs each one at ERROR
# with the traceback of its CancelledError: "Exception in callback
# StreamReaderProtocol.connection_made.<locals>.callback(<Task cancell...erver.py:336>>)" (the
# task's repr, cut by reprlib to 30 characters, names it cancelled). No failure: not shown.
_CANCELLED_CALLBACK = re.compile(re.escape(_CALLBACK) + r".*\(<Task cancell")


class LogSorter:
    """Sorts one of ft_launcher's streams, line by line, into the launcher's own log records and
    the rest (the workers' output, Python's warnings, anything else), by the loggers' line
    formats. A record continues on the indented rows of a table that follow it (and the blank
    line that ends the table), or on the traceback logged with it (``Traceback (most recent
    call last):`` right after it, its indented frames, the exception's line, and the tracebacks
    chained to it); any other line is not the launcher's.

    ``sort`` says whether a line is the launcher's and whether it is shown without ``-v``: every
    line that is not the launcher's; the launcher's errors (with their tracebacks), but for
    asyncio's report of a cancelled rank monitor connection (``_CANCELLED_CALLBACK``: ft_launcher
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
        match = _LAUNCHER_RECORD.match(line)
        if match:
            level = match.group("a") or match.group("b") or match.group("c")
            message = line[match.end() :].strip()
            shown = level in _ERROR_LEVELS or (level in _WARNING_LEVELS and message not in self.seen)
            if level in _WARNING_LEVELS:
                self.seen.add(message)
            if _CANCELLED_CALLBACK.match(message):
                shown = False
            self._record, self._rows = shown, False
            self._trace = "handle" if message.startswith(_CALLBACK) else "head"
            self._error_record = level in _ERROR_LEVELS
            return True, shown
        if self._record is not None:
            shown = self._record
            if self._traceback(line.rstrip("\r\n")):
                return True, shown
            if _TABLE_ROW.match(line):
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
        if trace == "handle" and text.startswith(_HANDLE):
            self._trace = "head"
            return True
        if trace is not None and text == _TRACEBACK:
            self._trace = "frames"
            self._first_frame = True
            return True
        if trace == "end" and (not text.strip() or text in _CHAINED):
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
        if text == _TRACEBACK:
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

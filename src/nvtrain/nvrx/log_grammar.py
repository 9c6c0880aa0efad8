"""The grammar of ft_launcher's log lines: what NVRx 0.4 and 0.6/0.7 (and torch's elastic agent
under them) print, recognised as plain values. ``launcher/logwatch.py`` turns these into the
events nvtrain acts on and sorts the launcher's own records from the workers' output.

Each recogniser is tested on lines recorded from every supported NVRx version
(``tests/nvrx/recorded/``, ``tests/launcher/nvrx_logs/``). Pure: no NVRx import, no I/O.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = [
    "CALLBACK",
    "CHAINED",
    "ERROR_LEVELS",
    "HANDLE",
    "OUT_OF_SECTION",
    "RENDEZVOUS_TIMEOUT",
    "TRACEBACK",
    "WARNING_LEVELS",
    "AgentError",
    "Hang",
    "Joined",
    "Record",
    "Restart",
    "WorkerExit",
    "agent_error",
    "cancelled_callback",
    "hang",
    "joined",
    "launcher_record",
    "restart",
    "table_row",
    "worker_exit",
]

RENDEZVOUS_TIMEOUT = "RendezvousTimeoutError"
"""The exception ft_launcher ends with when the rendezvous did not gather its nodes within
``join_timeout`` (``AgentError.error``)."""

OUT_OF_SECTION = "out-of-section"
"""``Hang.section`` when no section was open for longer than ``out_of_section_timeout``."""

# -- the lines nvtrain acts on ------------------------------------------------------------------

# torch's agent on a worker's exit (0.6/0.7 log it through torch, 0.4 through its own copy).
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
_AGENT_ERROR = re.compile(r"Agent run ended with exception,? (.*?)\.? Agent's exit code")
# The message is NVRx's f"{e=}": "e=RendezvousTimeoutError()", "e=RendezvousConnectionError('...')"
_ERROR_CLASS = re.compile(r"^e=(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*)\(")
# 0.4: "joined round N of the rendezvous ..."; 0.6/0.7: "joined the rendezvous ..." (no round)
_JOINED = re.compile(
    r"joined (?:round (\d+) of )?the rendezvous '([^']*)' as rank (\d+) in a world of size (\d+)"
)


@dataclasses.dataclass(frozen=True)
class WorkerExit:
    """``failed (exitcode: -9) local_rank: 1 (pid: 715) ...``: a worker ended with an error."""

    local_rank: int
    pid: int
    exit_code: int


@dataclasses.dataclass(frozen=True)
class Restart:
    """``Worker group UNHEALTHY. 2/3 attempts left; ...``: ft_launcher restarts its workers."""

    attempts_left: int
    max_restarts: int


@dataclasses.dataclass(frozen=True)
class Hang:
    """A rank monitor's report of a hung rank: the global ``rank`` (0.4) or the ``local_rank``
    (0.6/0.7), one of them set; the heartbeat missed (``initial`` or ``subsequent``) or the
    section open too long (``OUT_OF_SECTION``: none open for too long)."""

    rank: int | None
    local_rank: int | None
    heartbeat: str | None
    section: str | None


@dataclasses.dataclass(frozen=True)
class AgentError:
    """``Agent run ended with exception, e=...``: the whole ``e=...`` text, and the exception's
    class when the text names one (``RendezvousTimeoutError``, ``SignalException``)."""

    message: str
    error: str | None


@dataclasses.dataclass(frozen=True)
class Joined:
    """``... joined [round N of] the rendezvous 'x' as rank R in a world of size W``; ``round``
    only on 0.4."""

    round: int | None
    group_rank: int
    nodes: int


def worker_exit(line: str) -> WorkerExit | None:
    match = _FAILED.search(line)
    if match is None:
        return None
    return WorkerExit(local_rank=int(match.group(2)), pid=int(match.group(3)), exit_code=int(match.group(1)))


def restart(line: str) -> Restart | None:
    match = _RESTART.search(line)
    if match is None:
        return None
    left, limit = match.group(1, 2) if match.group(1) else match.group(3, 4)
    return Restart(attempts_left=int(left), max_restarts=int(limit))


def hang(line: str) -> Hang | None:
    match = _HANG.search(line)
    if match is None:
        return None
    section = match.group(4)
    if section is None and match.group(5):
        section = OUT_OF_SECTION
    rank, local_rank = match.group(1, 2)
    return Hang(
        rank=int(rank) if rank is not None else None,
        local_rank=int(local_rank) if local_rank is not None else None,
        heartbeat=match.group(3),
        section=section,
    )


def agent_error(line: str) -> AgentError | None:
    match = _AGENT_ERROR.search(line)
    if match is None:
        return None
    message = match.group(1)
    kind = _ERROR_CLASS.match(message)
    return AgentError(message=message, error=kind.group(1) if kind else None)


def joined(line: str) -> Joined | None:
    match = _JOINED.search(line)
    if match is None:
        return None
    return Joined(
        round=int(match.group(1)) if match.group(1) else None,
        group_rank=int(match.group(3)),
        nodes=int(match.group(4)),
    )


# -- the launcher's own log records -------------------------------------------------------------

# A log record of ft_launcher or of its rank monitors, by the logger's line format, with its level:
# NVRx 0.4: "[2026-12-02 09:15:22,261] [INFO] [ft_launcher12528@vm] ...", "[...] [INFO]
#   [RankMonServer12557@vm:1] ...", "[...] [ALWAYS] [RankMonServer.Restarter] ..." (stdout);
# NVRx 0.6/0.7: "2026-12-02 09:16:30,389 [INFO] [vm] [workload:?(?) infra:?(?)] launcher.py:2610 ...";
# torch's elastic agent (0.6/0.7): "E1202 09:16:52.997000 645 torch/distributed/elastic/...:986] ...",
# the file's path relative to the first sys.path entry that holds it: the launcher's working folder
# when torch is installed below it ("... 645 .venv/lib/python3.11/site-packages/torch/..."),
# absolute when none does.
_LAUNCHER_RECORD = re.compile(
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[(?P<a>[A-Z]+)\] "
    r"\[(?:ft_launcher\d+@[^\]]*|RankMonServer[^\]]*)\] "
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[(?P<b>[A-Z]+)\] \[[^\]]*\] \[workload:[^\]]*\] "
    r"|(?P<c>[DIWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ (?:[^\s\]]*/)?torch/distributed/elastic/[^\]]*\] "
)
WARNING_LEVELS = frozenset({"WARNING", "W"})
ERROR_LEVELS = frozenset({"ERROR", "CRITICAL", "FATAL", "E", "F"})
# The rest of a multi-line record: the indented "key : value" or "key=value" rows of a table
# ("Starting elastic_operator with launch configs:", torch's "Rendezvous complete ... Result:").
_TABLE_ROW = re.compile(r"[ \t]+[A-Za-z_][\w ]*?[ \t]*[:=]")
# Or the traceback of a record logged with its exception (``logger.exception``, asyncio's
# "Exception in callback ..." with its "handle: <Handle ...>" line first): its frames are
# indented, and its last line, the exception, is not; chained exceptions follow after a blank line.
TRACEBACK = "Traceback (most recent call last):"
CHAINED = frozenset(
    {
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    }
)
CALLBACK = "Exception in callback "
HANDLE = "handle: <Handle "
# As ft_launcher stops its workers (a stop nvtrain asked for, or a restart), it cancels the rank
# monitors' connection handlers that still hold a connection, and asyncio logs each one at ERROR
# with the traceback of its CancelledError: "Exception in callback
# StreamReaderProtocol.connection_made.<locals>.callback(<Task cancell...erver.py:336>>)" (the
# task's repr, cut by reprlib to 30 characters, names it cancelled). No failure.
_CANCELLED_CALLBACK = re.compile(re.escape(CALLBACK) + r".*\(<Task cancell")


@dataclasses.dataclass(frozen=True)
class Record:
    """The first line of a log record of ft_launcher, its rank monitors or torch's elastic
    agent: the ``level`` as the logger spells it (``INFO``, ``E``), the ``message`` after the
    record's prefix (stripped)."""

    level: str
    message: str


def launcher_record(line: str) -> Record | None:
    """The record ``line`` begins, if it begins one in a launcher logger's format."""
    match = _LAUNCHER_RECORD.match(line)
    if match is None:
        return None
    level = match.group("a") or match.group("b") or match.group("c")
    return Record(level=level, message=line[match.end() :].strip())


def table_row(line: str) -> bool:
    """Whether ``line`` is an indented ``key: value`` / ``key=value`` row of a record's table."""
    return _TABLE_ROW.match(line) is not None


def cancelled_callback(message: str) -> bool:
    """Whether a record's message is asyncio's report of a cancelled rank monitor connection."""
    return _CANCELLED_CALLBACK.match(message) is not None

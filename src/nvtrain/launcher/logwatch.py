"""Reads ft_launcher's log lines and turns the ones nvtrain acts on into events."""

from __future__ import annotations

import re
import signal

from nvtrain.events.records import (
    Event,
    HangDetected,
    LauncherError,
    RendezvousDone,
    RestartBegin,
    WorkerFailed,
)

__all__ = ["RENDEZVOUS_TIMEOUT", "parse_line", "read_line", "signal_name"]

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
_HANG = re.compile(
    r"(?:RankMonServer\d+@[^:\]]*:(\d+)\]|\[workload:[^(\]]*\((\d+)\) infra:[^\]]*\])"
    r".*Did not get (initial|subsequent) heartbeat"
)
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
        if match.group(1) is not None:  # 0.4: the global rank
            return HangDetected(source="launcher", rank=int(match.group(1)), heartbeat=match.group(3))
        return HangDetected(source="launcher", local_rank=int(match.group(2)), heartbeat=match.group(3))
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

"""Child processes that leave nothing behind: own session, TERM -> one deadline -> KILL.

ft_launcher starts each worker in a session of its own, and NVRx monitor daemons detach, so a
process-group signal does not reach them all. nvtrain therefore makes itself a *child subreaper*
(Linux): orphaned descendants are re-parented to nvtrain instead of init, and ``stop`` signals
every descendant it can find, not only the launcher's group.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

import psutil

__all__ = ["Child", "become_subreaper", "descendants", "kill_all"]

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make orphaned descendants this process's children (Linux only). True on success."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """Every living descendant of ``pid`` (default: this process)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _signal_all(procs: Sequence[psutil.Process], signum: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(signum)


def kill_all(timeout: float = 5.0) -> list[int]:
    """TERM every descendant of this process, wait up to ``timeout``, KILL the rest.

    Returns the pids that had to be killed. Safe to call more than once.
    """
    procs = descendants()
    _signal_all(procs, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    alive += [p for p in descendants() if p not in alive]
    _signal_all(alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5.0)
    _reap()
    return [p.pid for p in alive]


def _reap() -> None:
    """Collect exit statuses of re-parented orphans so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Child:
    """One child process in a session of its own, stopped TERM -> deadline -> KILL."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *, capture: bool) -> None:
        self.argv = list(argv)
        self.popen = subprocess.Popen(
            self.argv,
            env=dict(env),
            start_new_session=True,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else None,
            text=capture,
            bufsize=1 if capture else -1,
            errors="replace" if capture else None,
        )
        self.pid = self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signum)

    def stop(self, deadline: float, signum: int = signal.SIGTERM) -> int:
        """Send ``signum`` to the child, wait until ``deadline`` (monotonic), then KILL the
        child and every other descendant. Returns the child's exit status."""
        if self.poll() is None:
            self.send(signum)
        code = self.wait(max(deadline - time.monotonic(), 0.0))
        if code is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            code = self.popen.wait()
        kill_all(timeout=1.0)
        return code

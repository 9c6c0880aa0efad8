"""Child processes that leave nothing behind: own session, TERM -> one deadline -> KILL.

ft_launcher starts each worker in a session of its own, and NVRx monitor daemons detach, so a
process-group signal does not reach them all. nvtrain therefore makes itself a *child subreaper*
(Linux): orphaned descendants are re-parented to nvtrain instead of init, and ``stop`` signals
every descendant it can find, not only the launcher's group.

A SIGKILLed nvtrain cleans up nothing, so a ``Child`` may get a *guard*: a small process of its
own (``python -m nvtrain.launcher.process``, in a session of its own) that blocks on a pipe whose
only writer is nvtrain. When nvtrain ends for any reason the pipe reports end-of-file; if the
child still runs, the guard sends it SIGTERM once (ft_launcher then stops its workers and rank
monitors), and SIGKILLs whatever of the child's tree still runs ``guard`` seconds later. (A
parent-death signal, ``PR_SET_PDEATHSIG``, is not used: Linux sends it again each time the child
is handed to another thread of the dying parent, and a second SIGTERM makes ft_launcher abandon
the shutdown of its workers half-way.)

A ``Child``'s exit is waited for on a pidfd (Linux 5.3+; elsewhere ``Popen.wait``, which polls):
the supervisor learns that ft_launcher ended the moment it ends, not at its next look.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Iterator, Mapping, Sequence

import psutil

__all__ = ["STOPPED", "Child", "become_subreaper", "descendants", "kill_all", "stop_descendants", "stopped"]

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


STOPPED = {psutil.STATUS_STOPPED: "stopped", psutil.STATUS_TRACING_STOP: "tracing-stop"}
"""Process states in which a process runs nothing, and so cannot act on SIGTERM (SIGSTOP, a
debugger), with the name nvtrain logs for each."""


def stopped(procs: Sequence[psutil.Process]) -> list[tuple[psutil.Process, str]]:
    """The processes of ``procs`` that are stopped now (``STOPPED``), with their state's name."""
    found = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            state = STOPPED.get(proc.status())
            if state is not None:
                found.append((proc, state))
    return found


KILL_WAIT = 5.0
"""Seconds ``stop_descendants`` waits for the processes it KILLed to end: a KILL is not an
instant exit (a worker's memory is freed first; one in uninterruptible sleep waits for its I/O)."""


def stop_descendants(deadline: float, keep: Collection[int] = ()) -> list[int]:
    """TERM every descendant of this process but those in ``keep`` (and KILL at once those that
    are stopped: they cannot act on TERM), wait until ``deadline`` (monotonic) for them to end,
    KILL the rest and wait for those to end (``KILL_WAIT`` at most); returns the pids killed. A
    process counts as ended once it is a zombie: its parent may be one of ``keep``, frozen.
    Descendants that appear meanwhile are told too."""

    def others() -> list[psutil.Process]:
        return [p for p in descendants() if p.pid not in keep]

    told: list[psutil.Process] = []
    killed: list[int] = []
    while True:
        new = [p for p in others() if p not in told and _running(p)]
        for proc, _ in stopped(new):
            _signal_all([proc], signal.SIGKILL)
            killed.append(proc.pid)
        _signal_all(new, signal.SIGTERM)
        told += new
        if not any(_running(p) for p in told) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    left = [p for p in others() if _running(p)]
    _signal_all(left, signal.SIGKILL)
    until = time.monotonic() + KILL_WAIT
    while any(_running(p) for p in left) and time.monotonic() < until:
        time.sleep(0.01)
    return killed + [p.pid for p in left if p.pid not in killed]


def _reap() -> None:
    """Collect exit statuses of re-parented orphans so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when process ``pid`` ends; None where the kernel or
    Python has no pidfds."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class Child:
    """One child process in a session of its own, stopped TERM -> deadline -> KILL.

    With ``guard`` (seconds), the child and its tree are also stopped when this process dies
    without stopping them (see the module's docstring).
    """

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], *, capture: bool, guard: float | None = None
    ) -> None:
        self.argv = list(argv)
        self.popen = subprocess.Popen(
            self.argv,
            env=dict(env),
            start_new_session=True,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            text=capture,
            bufsize=1 if capture else -1,
            errors="replace" if capture else None,
        )
        self.pid = self.popen.pid
        self._pidfd = _pidfd(self.pid)  # the child is not waited for yet: the pid is its own
        self.guard: subprocess.Popen[bytes] | None = None
        self._guard_pipe: int | None = None
        if guard is not None:
            self.guard, self._guard_pipe = _start_guard(self.pid, guard)

    def poll(self) -> int | None:
        return self._ended(self.popen.poll())

    def stdout_lines(self) -> Iterator[str]:
        """The child's stdout, line by line, until it closes (``capture``)."""
        stream = self.popen.stdout
        assert stream is not None, "started without capture"
        return iter(stream)

    def stderr_lines(self) -> Iterator[str]:
        """The child's stderr, line by line, until it closes (``capture``)."""
        stream = self.popen.stderr
        assert stream is not None, "started without capture"
        return iter(stream)

    def wait(self, timeout: float | None = None) -> int | None:
        """The child's exit status once it has exited, waiting up to ``timeout`` seconds (None:
        as long as it takes); None while it runs."""
        if timeout is not None and self._pidfd is not None and self.popen.returncode is None:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            poller.poll(max(0, math.ceil(timeout * 1000)))  # resumed after a signal handler
            return self.poll()
        try:
            return self._ended(self.popen.wait(timeout))
        except subprocess.TimeoutExpired:
            return None

    def _ended(self, code: int | None) -> int | None:
        """Once the child has exited, let its guard go (it finds nothing to stop and exits)."""
        if code is not None and self._guard_pipe is not None:
            os.close(self._guard_pipe)
            self._guard_pipe = None
        if code is not None and self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return code

    def send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signum)

    def kill(self) -> int:
        """SIGKILL the child (not its group) and wait for it; returns its exit status."""
        self.send(signal.SIGKILL)
        code = self.wait()
        assert code is not None
        return code

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

    def freeze(self) -> None:
        """SIGSTOP the child (not its tree): it starts nothing more until it is killed."""
        self.send(signal.SIGSTOP)

    def stop_frozen(self, deadline: float, keep: Collection[int] = ()) -> int:
        """Stop the child's work without letting it run again: freeze it (``freeze``), stop
        every other descendant of this process but its guard and ``keep`` (``stop_descendants``:
        TERM, ``deadline``, KILL), then KILL the child. Returns the child's exit status. For
        a child that would start new workers after a TERM it ignored (ft_launcher in the middle
        of a restart)."""
        self.freeze()
        spared = {self.pid, *keep}
        if self.guard is not None:
            spared.add(self.guard.pid)
        stop_descendants(deadline, spared)
        return self.kill()


def _start_guard(pid: int, timeout: float) -> tuple[subprocess.Popen[bytes], int]:
    """Start the guard of child ``pid`` (not waited for yet, so the pid is still its own);
    returns the guard and the pipe's write end, kept open until the child has exited."""
    started = psutil.Process(pid).create_time()  # the guard checks it: a pid can be reused
    read_end, write_end = os.pipe()  # not inherited by other children (O_CLOEXEC, close_fds)
    try:
        guard = subprocess.Popen(
            [sys.executable, "-m", __name__, str(pid), repr(started), repr(timeout)],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # outlives a signal to this process's group
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return guard, write_end


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]


def _guard(pid: int, started: float, timeout: float) -> None:
    """The guard's work: wait until the launcher process's end of stdin closes; if child ``pid``
    (created at ``started``) still runs, SIGTERM it once, and SIGKILL what is left of its tree
    after ``timeout`` seconds."""
    try:
        child = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    if child.create_time() != started:
        return
    sys.stdin.buffer.read()  # returns at end-of-file only
    if not _running(child):
        return
    tree = _tree(child)
    _signal_all([child], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    orphans_told = False
    while time.monotonic() < deadline and any(_running(p) for p in tree):
        if _running(child):  # workers it starts meanwhile are stopped too
            tree += [p for p in _tree(child) if p not in tree]
        elif not orphans_told:  # it ended and left these behind
            _signal_all([p for p in tree if _running(p)], signal.SIGTERM)
            orphans_told = True
        time.sleep(0.1)
    _signal_all([p for p in tree if _running(p)], signal.SIGKILL)


if __name__ == "__main__":
    _guard(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))

"""Which worker of this node a hang is in: the one whose process is stopped.

A rank blocked in a collective misses its heartbeats as surely as the rank it waits for, so the
rank monitor that fires first may well name a healthy rank. A process that is stopped (SIGSTOP, a
debugger: state ``T`` or ``t``) runs nothing at all: that one hung. It cannot act on SIGTERM
either, so ft_launcher's stop of the workers would wait for it up to its whole stop timeout; it
gets SIGKILL instead.

``Stalls`` looks at the process states of the supervisor's tree about once a second (a few small
``/proc`` reads: the tree is walked through ``/proc/<pid>/task/<tid>/children``) and remembers the
workers it saw stopped, with their ranks: from the process's environment (a worker ft_launcher
started), or from that of the process standing in for it (a warm worker, forked by the
warm-start server: its client holds a pidfd of it and has the rank's environment). A stopped
worker that a rank monitor killed meanwhile (it sends SIGCONT, then its signal) is still
remembered, so the hang is blamed on it all the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Collection, Iterator

__all__ = ["LOOK_EVERY", "STATES", "Stalled", "Stalls", "state_of", "tree", "worker_ranks"]

LOOK_EVERY = 1.0
"""Seconds between two looks at the tree's process states: a hang is reported seconds after
the worker stopped (``[heartbeat] timeout``), so a stopped worker has been seen by then."""

STATES = {"T": "stopped", "t": "tracing-stop"}
"""Process states (``/proc/<pid>/stat``) in which a process runs nothing and cannot act on
SIGTERM, with the name nvtrain logs for each."""


@dataclasses.dataclass(frozen=True)
class Stalled:
    """A worker process seen stopped: pid, its start time (clock ticks since boot: a reused pid
    is told apart), state's name, ranks (None: unknown)."""

    pid: int
    started: int
    state: str
    rank: int | None
    local_rank: int | None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of process ``pid``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def state_of(pid: int) -> str | None:
    """Process ``pid``'s state letter (``S``, ``R``, ``T``, ``Z``...); None once it is gone."""
    stat = _stat(pid)
    return stat[0] if stat else None


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as children:
                    found += [int(word) for word in children.read().split()]
    return found


def tree(root: int) -> Iterator[int]:
    """Every living descendant of process ``root``, parents before their children."""
    todo = _children(root)
    seen: set[int] = set()
    while todo:
        pid = todo.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        yield pid
        todo += _children(pid)


def _env_ranks(pid: int) -> tuple[int | None, int | None] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            pairs = environ.read().split(b"\0")
    except OSError:
        return None
    env = dict(p.decode("utf-8", "replace").partition("=")[::2] for p in pairs if b"=" in p)
    if "LOCAL_RANK" not in env and "RANK" not in env:
        return None
    return _int(env.get("RANK")), _int(env.get("LOCAL_RANK"))


def _int(text: str | None) -> int | None:
    with contextlib.suppress(TypeError, ValueError):
        return int(text)  # type: ignore[arg-type]
    return None


def _holds_pidfd(holder: int, pid: int) -> bool:
    """Whether process ``holder`` has a pidfd of process ``pid`` open (``Pid:`` in its fdinfo)."""
    wanted = f"Pid:\t{pid}"
    folder = f"/proc/{holder}/fdinfo"
    try:
        fds = os.listdir(folder)
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            with open(f"{folder}/{fd}", encoding="ascii", errors="replace") as info:
                if any(line.rstrip("\n") == wanted for line in info):
                    return True
    return False


def worker_ranks(pid: int, among: Collection[int]) -> tuple[int | None, int | None]:
    """(global rank, local rank) of worker process ``pid``, each None when unknown: those of the
    process of ``among`` that stands in for it (holds a pidfd of it), else its own."""
    for other in among:
        if other != pid and _holds_pidfd(other, pid):
            ranks = _env_ranks(other)
            if ranks is not None:
                return ranks
    return _env_ranks(pid) or (None, None)


class Stalls:
    """The workers of this process's tree seen stopped (``look``), until ``take`` hands them on.

    ``rank_of``: a worker's global rank by pid, when it logged its start (preferred to its
    environment's)."""

    def __init__(
        self,
        rank_of: Callable[[int], int | None] = lambda pid: None,
        *,
        root: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root if root is not None else os.getpid()
        self.rank_of = rank_of
        self.clock = clock
        self.seen: dict[int, Stalled] = {}
        self._looked: float | None = None

    def look(self, spared: Collection[int], *, now: bool = False) -> None:
        """Note the stopped workers (every descendant but ``spared``), at most every
        ``LOOK_EVERY`` seconds unless ``now``. One that runs again is forgotten."""
        at = self.clock()
        if not now and self._looked is not None and at - self._looked < LOOK_EVERY:
            return
        self._looked = at
        pids = [p for p in tree(self.root) if p not in spared]
        for pid in pids:
            stat = _stat(pid)
            if stat is None:
                continue
            letter, started = stat
            known = self.seen.get(pid)
            if known is not None and known.started != started:
                del self.seen[pid]  # a pid reused
                known = None
            state = STATES.get(letter)
            if state is None:
                if known is not None and letter not in ("Z", "X"):
                    del self.seen[pid]  # it runs again
                continue
            if known is None:
                rank, local_rank = worker_ranks(pid, pids)
                logged = self.rank_of(pid)
                self.seen[pid] = Stalled(
                    pid, started, state, logged if logged is not None else rank, local_rank
                )

    def take(self, spared: Collection[int]) -> list[tuple[Stalled, bool]]:
        """Look now; the workers seen stopped since the last ``take``, each with whether it is
        still stopped now (and was SIGKILLed here: it cannot act on SIGTERM) or has ended."""
        self.look(spared, now=True)
        found = []
        for stalled in self.seen.values():
            stat = _stat(stalled.pid)
            still = stat is not None and stat[1] == stalled.started and stat[0] in STATES
            if still:
                with contextlib.suppress(OSError):
                    os.kill(stalled.pid, signal.SIGKILL)
            found.append((stalled, still))
        self.seen.clear()
        return found

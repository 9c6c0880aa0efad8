"""``RunLog``: the events of one run, oldest first, and what they say."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable
from operator import attrgetter

from nvtrain.events.read import Events
from nvtrain.events.records import AttemptStart, Event, LauncherExit, LauncherStart, RestartBegin
from nvtrain.runlog.checkpoints import (
    Origin,
    Saves,
    find_commits,
    find_saves,
    load_times,
    save_block_times,
    save_wait_times,
    save_write_times,
)
from nvtrain.runlog.kinds import WORKER_EVENTS, pod_restarts
from nvtrain.runlog.recoveries import Recovery, find_recoveries
from nvtrain.runlog.steps import Stretch, find_stretch, logged_step_times

__all__ = ["RunLog"]

_ts = attrgetter("ts")


class RunLog:
    """The events of one run, oldest first, and what they say; each figure is worked out on
    first use, once.

    ``events`` may come in any order (every node's events together); ``skipped`` is how many
    lines of the log were not valid events (``Events.skipped`` when not given).
    """

    def __init__(self, events: Iterable[Event], *, skipped: int | None = None) -> None:
        if skipped is None:
            skipped = events.skipped if isinstance(events, Events) else 0
        self.skipped = skipped
        self.events: list[Event] = sorted(events, key=_ts)
        self.t0 = self.events[0].ts if self.events else 0.0
        """Unix time of the first event."""
        self.total = self.events[-1].ts - self.t0 if self.events else 0.0
        """Seconds from the first event to the last."""

    # -- recoveries and the stretches of training between them ---------------------------------

    @functools.cached_property
    def recoveries(self) -> tuple[Recovery, ...]:
        """Every recovery, oldest first; only the last may be one that did not recover."""
        return find_recoveries(self.events, pod_restarts(self.events))

    @functools.cached_property
    def parts(self) -> tuple[list[Event], ...]:
        """The events of each stretch: cut at the first completed step of each recovery that
        recovered (an event at the same time goes to the later stretch)."""
        times = [e.ts for e in self.events]
        bounds = [r.end for r in self.recoveries if r.end is not None]
        cuts = [0, *(bisect.bisect_left(times, b) for b in bounds), len(self.events)]
        return tuple(self.events[a:b] for a, b in zip(cuts, cuts[1:], strict=False))

    @functools.cached_property
    def stretches(self) -> tuple[Stretch, ...]:
        """The stretches of training: one more than the recoveries that recovered."""
        return tuple(find_stretch(part) for part in self.parts)

    # -- checkpoints ---------------------------------------------------------------------------

    @functools.cached_property
    def commits(self) -> tuple[tuple[float, int], ...]:
        """(unix time, step) of each usable commit, once per stretch and step, oldest first."""
        return find_commits(self.parts)

    @functools.cached_property
    def saves(self) -> Saves:
        return find_saves(self.parts)

    # -- the samples tune-interval measures (every rank's events count) ------------------------

    @functools.cached_property
    def step_times(self) -> tuple[float, ...]:
        """``steps.logged_step_times``: logged step times, leaving out the steps right after a save."""
        return logged_step_times(self.events)

    @functools.cached_property
    def save_blocks(self) -> tuple[float, ...]:
        """``checkpoints.save_block_times``: what each rank's save blocked, less its waits."""
        return save_block_times(self.events)

    @functools.cached_property
    def save_writes(self) -> tuple[float, ...]:
        return save_write_times(self.events)

    @functools.cached_property
    def save_waits(self) -> tuple[float, ...]:
        return save_wait_times(self.events)

    @functools.cached_property
    def loads(self) -> tuple[tuple[float, ...], Origin | None]:
        """``checkpoints.load_times``: the load times, and where they read from."""
        return load_times(self.events)

    # -- the run -------------------------------------------------------------------------------

    @functools.cached_property
    def last_worker_ts(self) -> float:
        """The workers' last event (an event of a worker, or an in-process restart)."""
        for e in reversed(self.events):
            if isinstance(e, WORKER_EVENTS) or (isinstance(e, RestartBegin) and e.in_process):
                return e.ts
        return self.events[-1].ts if self.events else 0.0

    @functools.cached_property
    def run_id(self) -> str | None:
        return next((e.run_id for e in self.events if e.run_id is not None), None)

    @functools.cached_property
    def nodes(self) -> int:
        """Nodes whose launcher started (1 when none did)."""
        return len({e.node for e in self.events if isinstance(e, LauncherStart)}) or 1

    @functools.cached_property
    def ranks(self) -> int | None:
        """The largest world an attempt started with, else how many ranks logged; None if none did."""
        worlds = [e.world for e in self.events if isinstance(e, AttemptStart) and e.world]
        if worlds:
            return max(worlds)
        ranks = {e.rank for e in self.events if isinstance(e, WORKER_EVENTS) and e.rank is not None}
        return len(ranks) or None

    @functools.cached_property
    def exit_code(self) -> int | None:
        """The highest non-zero exit code of the nodes' last ``launcher_exit``; 0 when every node
        exited 0; None when none logged one."""
        last: dict[object, int] = {}
        for e in self.events:
            if isinstance(e, LauncherExit) and e.exit_code is not None:
                last[e.where] = e.exit_code
        if not last:
            return None
        failed = [c for c in last.values() if c != 0]
        return max(failed) if failed else 0

    @functools.cached_property
    def ended(self) -> bool:
        """A launcher logged its exit."""
        return any(isinstance(e, LauncherExit) for e in self.events)

    @functools.cached_property
    def finished(self) -> bool:
        """Every node's launcher logged its exit after its last start: the run is over (a node
        whose pod was replaced starts again; one whose launcher was killed never finishes)."""
        running: dict[object, bool] = {}
        for e in self.events:
            if isinstance(e, LauncherStart):
                running[e.where] = True
            elif isinstance(e, LauncherExit):
                running[e.where] = False
        return bool(running) and not any(running.values())

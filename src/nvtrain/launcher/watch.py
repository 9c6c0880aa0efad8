"""What the supervisor learns about the run on this node, read once into typed records.

Structured sources come first; ft_launcher's log text only says what nothing else does:

- the workers' events (the run's events log, ``EventTail``): an attempt's start and its restart
  round (``worker_start``: ``restart_count`` is ``TORCHELASTIC_RESTART_COUNT``), progress
  (``step``), a worker told to stop (``worker_stopped``) or whose in-process layer gave up
  (``worker_gave_up``), checkpoint saves that fail (``checkpoint_failed``);
- ft_launcher's log lines (``logwatch.read_line``): which worker failed, with its pid and exit
  code or signal; the rank monitor's missing heartbeat; a completed rendezvous (an attempt's start
  for scripts that log no events); ft_launcher's own error (a rendezvous timeout among them);
  the restarts it logged;
- the signals that reach ``nvtrain run`` (set by the supervisor).

``Watch`` decides escalation (failures that repeat without progress) and is what
``outcome.decide`` reads to say how the run ended (``outcome.Observed``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from nvtrain.config.schema import Policy
from nvtrain.events import EventTail, Reporter
from nvtrain.events.records import (
    CheckpointAlreadyCommitted,
    CheckpointCommitted,
    CheckpointCorrupt,
    CheckpointFailed,
    CheckpointPartial,
    CheckpointRestored,
    CheckpointSettled,
    Event,
    EventsLogError,
    EventsLogResumed,
    FaultInjected,
    HangDetected,
    LauncherError,
    RendezvousDone,
    RestartBegin,
    RestartEnd,
    Step,
    WorkerFailed,
    WorkerGaveUp,
    WorkerStart,
    WorkerStopped,
)
from nvtrain.launcher.logwatch import RENDEZVOUS_TIMEOUT, read_line
from nvtrain.launcher.outcome import seconds

__all__ = ["Watch"]

_SHOWN = (
    FaultInjected,
    RestartBegin,
    RestartEnd,
    CheckpointRestored,
    CheckpointSettled,
    CheckpointCorrupt,
    CheckpointPartial,
    CheckpointFailed,
)
"""Worker events shown as they happen (they are in the log already)."""


class Watch:
    """What ft_launcher's log, the workers' events and the signals told the supervisor so far.

    ``line`` is called by the thread reading ft_launcher's output, ``poll_workers`` by the
    supervisor's loop; both take ``lock``. ``signum`` is set by the signal handler (no lock: it
    may interrupt a holder). Workers' events of this node are told apart by ``node``, or by
    ``host`` for writers that do not log their node.
    """

    def __init__(
        self,
        policy: Policy,
        tail: EventTail,
        report: Reporter,
        *,
        node: int,
        host: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.tail = tail
        self.report = report
        self.node = node
        self.host = host
        self.clock = clock
        self.lock = threading.Lock()
        self.signum: int | None = None
        """The first forwarded signal that reached ``nvtrain run``."""
        self.escalated: str | None = None
        """Why the run is a loop without progress (exit 4), once it is."""
        self.failures: list[WorkerFailed] = []
        """Worker failures on this node, first first (as logged: hang, step, stop, gave up)."""
        self.launcher_error: str | None = None
        """The running (or last) ft_launcher's error message, if it ended with one."""
        self.rendezvous_timeout = False
        """That error was a rendezvous that did not complete within join_timeout."""
        self.world_nodes: int | None = None
        """Nodes in the last completed rendezvous round, if one completed."""
        self.last_step: int | None = None
        """The job's newest step, from any node's workers."""
        self.attempt_started = clock()
        """When the current attempt's workers started (see ``line`` and ``_worker_event``)."""
        self.storage: dict[str, str] = {}
        """Storage problems still current, by source (checkpoint saves, the events log)."""
        self._round: int | None = None
        """The newest restart round this ft_launcher's workers reported."""
        self._round_ranks: set[int] = set()
        """Ranks that reported the start of that round."""
        self._restart_lines = 0
        self._earlier_restarts = 0
        """In-job restarts of the ft_launchers before this one (a relaunched node)."""
        self._hangs: set[int] = set()
        """Local ranks whose rank monitor missed their heartbeat (NVRx 0.6/0.7 name them so)."""
        self._hung_ranks: set[int] = set()
        """Global ranks whose rank monitor missed their heartbeat (NVRx 0.4 names them so)."""
        self._rank_of: dict[int, int] = {}
        """Global rank of each worker process of this node that logged its start, by pid."""
        self._stopped: set[int] = set()
        self._gave_up: dict[int, str] = {}
        self._failed_pids: set[int] = set()
        self._last_rank: int | None = None
        self._same_rank = 0
        self._step_at_failure: int | None = None
        self._stalled = 0

    @property
    def budget_spent(self) -> bool:
        """The running (or last) ft_launcher used every in-job restart it had: its failure is
        the job's, not its own (NVRx 0.6 then ends with an error of its own as well)."""
        return self.restarts - self._earlier_restarts >= self.policy.restart.in_job.max_restarts

    @property
    def restarts(self) -> int:
        """In-job restarts so far. Per ft_launcher: the newest restart round its workers report
        (``TORCHELASTIC_RESTART_COUNT``, restarts used of its budget), or the restarts it logged
        when that is more (workers that died before reporting; scripts that log no events)."""
        return self._earlier_restarts + max(self._round or 0, self._restart_lines)

    def stopped(self) -> bool:
        """A forwarded signal arrived."""
        return self.signum is not None

    def storage_problem(self) -> str | None:
        """The storage problems still current, in one line (None when there are none)."""
        return "; ".join(self.storage.values()) or None

    def launcher_started(self) -> None:
        """A new ft_launcher starts: its first attempt counts from now until its workers start."""
        with self.lock:
            self._earlier_restarts = self.restarts
            self._round = None
            self._round_ranks = set()
            self._restart_lines = 0
            self._hangs.clear()
            self._hung_ranks.clear()
            self.attempt_started = self.clock()
            self.launcher_error = None
            self.rendezvous_timeout = False

    def events_log(self, record: Event) -> None:
        """The events log's own report (a write that failed, or works again)."""
        if isinstance(record, EventsLogError):
            self.storage["events"] = f"the events log {record.path} cannot be written: {record.error}"
        elif isinstance(record, EventsLogResumed):
            self.storage.pop("events", None)

    def line(self, text: str) -> Event | None:
        """Take one line of ft_launcher's output; returns the record to log, if it says
        something nvtrain acts on (a worker failure is logged once, with what else is known)."""
        record = read_line(text)
        if record is None:
            return None
        with self.lock:
            if isinstance(record, WorkerFailed):
                return self._failed(record)
            if isinstance(record, RendezvousDone):
                # The workers start right after it. Their own worker_start, when they log one,
                # is later and says so exactly; this is the start for scripts that log nothing.
                self.attempt_started = self.clock()
                self.world_nodes = record.nodes
            elif isinstance(record, RestartBegin):
                self._restart_lines += 1
            elif isinstance(record, HangDetected):
                if record.local_rank is not None:
                    self._hangs.add(record.local_rank)
                if record.rank is not None:
                    self._hung_ranks.add(record.rank)
            elif isinstance(record, LauncherError):
                self.launcher_error = record.message
                self.rendezvous_timeout = record.error == RENDEZVOUS_TIMEOUT
        return record

    def poll_workers(self) -> None:
        """Read what the workers logged since the last look; show faults, in-process restarts
        and restores as they happen."""
        with self.lock:
            self._read_workers()

    def _read_workers(self) -> None:
        for record in self.tail.poll():
            if record.by_launcher:
                continue
            self._worker_event(record)
            if isinstance(record, _SHOWN):
                self.report(record)  # shown, not logged again

    def _here(self, record: Event) -> bool:
        if record.node is not None:
            return record.node == self.node
        return record.host == self.host

    def _worker_event(self, record: Event) -> None:
        if isinstance(record, Step):
            if record.step is not None:
                self.last_step = max(self.last_step or 0, record.step)
        elif isinstance(record, CheckpointFailed):
            self.storage["checkpoint"] = (
                f"the checkpoint of step {record.step} was not saved: {record.error} "
                f"({record.failed_in_a_row or 1} failed save(s) in a row)"
            )
        elif isinstance(record, (CheckpointCommitted, CheckpointAlreadyCommitted)):
            self.storage.pop("checkpoint", None)
        elif not self._here(record):
            return
        elif isinstance(record, WorkerStart) and record.restart_count is not None:
            # A higher round is a restart; a rank starting again in the same round is one that
            # did not count (NVRx 0.4 does not count a restart for a node joining or leaving).
            count = record.restart_count
            if self._round is None or count > self._round or record.rank in self._round_ranks:
                self._round = max(count, self._round or 0)
                self._round_ranks = set()
                self.attempt_started = self.clock()
            if record.rank is not None:
                self._round_ranks.add(record.rank)
                if record.pid is not None:
                    self._rank_of[record.pid] = record.rank
        elif isinstance(record, WorkerStopped) and record.pid is not None:
            self._stopped.add(record.pid)
        elif isinstance(record, WorkerGaveUp) and record.pid is not None:
            self._gave_up[record.pid] = record.reason or "no reason given"

    def _failed(self, record: WorkerFailed) -> WorkerFailed | None:
        pid = record.worker_pid
        if pid is not None:
            if pid in self._failed_pids:
                return None  # the same failure, logged again
            self._failed_pids.add(pid)
        self._read_workers()  # what the workers logged before ft_launcher saw them end
        known = pid is not None
        rank = self._rank_of.get(pid) if pid is not None else None
        if rank is None and self.world_nodes == 1:
            rank = record.local_rank  # one node: the global rank is the local one
        hung = record.local_rank in self._hangs or (rank is not None and rank in self._hung_ranks)
        failure = dataclasses.replace(
            record,
            rank=rank,
            hang=True if hung else None,
            stopped=True if known and pid in self._stopped else None,
            gave_up=self._gave_up.get(pid) if pid is not None else None,
            step=self.last_step,
        )
        self._hangs.discard(record.local_rank)
        self._hung_ranks.discard(rank)
        if not failure.stopped:  # a worker that was told to stop is no fault
            self._check_progress(failure)
        self.failures.append(failure)
        return failure

    def _check_progress(self, failure: WorkerFailed) -> None:
        """Escalate when failures repeat without progress: at the same step when the workers
        report steps (the worker library does), else when the same local rank fails again in
        attempts that each ended within ``[heartbeat] initial_timeout`` of their start. An
        attempt that ran longer got past start-up, which counts as progress: the count of
        failures in a row starts again."""
        rank = failure.local_rank
        previous, self._last_rank = self._last_rank, rank
        limit = self.policy.restart.escalate_after
        step = failure.step
        if step is None:
            ran = self.clock() - self.attempt_started
            progressed = ran >= self.policy.heartbeat.initial_timeout
            same = previous is not None and previous == rank
            self._same_rank = self._same_rank + 1 if same and not progressed else 1
            if self._same_rank >= limit:
                self.escalated = (
                    f"local rank {rank} failed {self._same_rank} times in a row, "
                    "each time within [heartbeat] initial_timeout = "
                    f"{seconds(self.policy.heartbeat.initial_timeout)} of its attempt's start "
                    "(the workers report no steps; an attempt that runs longer counts as progress)"
                )
            return
        self._stalled = self._stalled + 1 if step == self._step_at_failure else 1
        self._step_at_failure = step
        if self._stalled >= limit:
            self.escalated = f"{self._stalled} failures in a row at step {step} (last: local rank {rank})"

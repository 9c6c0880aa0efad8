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
- the workers' tracebacks (``logwatch.read_raised``: torch.distributed prints an uncaught
  exception as ``[rank<N>]: ...`` lines): which rank raised first, and what. ft_launcher names
  one failed worker per attempt, the first it found; when its peers fail within the same look
  (a broken collective), that is the lowest local rank, not the one that failed first;
- the workers' other tracebacks (``logwatch.PlainTraceback``: an exception raised before
  ``init_process_group``, printed without a rank): the error of an attempt whose failure repeats;
- the signals that reach ``nvtrain run`` (set by the supervisor); the hangs it blamed on a
  worker (``blame``, from the process table).

A worker ft_launcher saw exit with an error is a ``worker_failed`` (a fault), or a
``worker_ended`` when it had been told to stop (it logged ``worker_stopped``, or ``nvtrain run``
had received a signal and passed it on): no fault, not counted for escalation. ``Watch`` decides
escalation (failures that repeat without progress, or a failure before the first step that
repeats with the same error) and is what ``outcome.decide`` reads to say how the run ended
(``outcome.Observed``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode
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
    HangBlamed,
    HangDetected,
    LauncherError,
    RendezvousDone,
    RestartBegin,
    RestartEnd,
    Step,
    WorkerEnded,
    WorkerFailed,
    WorkerGaveUp,
    WorkerStart,
    WorkerStopped,
)
from nvtrain.launcher.logwatch import (
    RENDEZVOUS_TIMEOUT,
    PlainTraceback,
    caused_by_peer,
    read_line,
    read_raised,
)
from nvtrain.launcher.outcome import seconds
from nvtrain.nvrx.ftmain import USAGE_ERROR

__all__ = ["SIGNAL_EXCEPTION", "STARTUP_LIMIT", "Watch"]

SIGNAL_EXCEPTION = "SignalException"
"""The exception ft_launcher ends with when a signal stopped it (``error`` of its
``launcher_error`` line): no error when nvtrain forwarded that signal (``Watch.signum``)."""

STARTUP_LIMIT = 20 * 60.0
"""Seconds an attempt must run to count as progress when ``[heartbeat] initial_timeout`` is not
set (NVRx's own default initial timeout is longer; a start-up rarely takes this long)."""

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
        self.escalated_failures = 0
        """Failures counted in a row when it escalated."""
        self.escalated_error: str | None = None
        """The script's error when it escalated, if known (the last failure's)."""
        self.escalated_early = False
        """It escalated before ``[restart] escalate_after``: a failure before the first step
        repeated with the same error."""
        self.blames: list[HangBlamed] = []
        """Hangs blamed on a worker of this node (or on one of several), first first."""
        self.hang_check = False
        """A hang was reported or a restart began since the supervisor last looked for stopped
        workers (``take_hang_check``)."""
        self._hang_reported = False
        """That look was asked for by a hang (not a restart alone)."""
        self.failures: list[WorkerFailed] = []
        """Worker failures on this node, first first (as logged: hang, step, gave up)."""
        self.ended: list[WorkerEnded] = []
        """Workers of this node that ended with an error status after they had been told to
        stop (they logged ``worker_stopped``), first first: no fault."""
        self.launcher_error: str | None = None
        """The running (or last) ft_launcher's error message, if it ended with one."""
        self.rendezvous_timeout = False
        """That error was a rendezvous that did not complete within join_timeout."""
        self.usage_error: str | None = None
        """ft_launcher refused its own command line (``ftmain``'s one line): nvtrain's exit 2."""
        self.worker_usage: str | None = None
        """A worker refused a call of the script (``worker.refusal``): nvtrain's exit 2."""
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
        self._last_rank: str | None = None
        """Who failed last (``_named``)."""
        self._same_rank = 0
        self._step_at_failure: int | None = None
        self._stalled = 0
        self._raised: dict[int, str | None] = {}
        """Global ranks of this attempt that printed a traceback, first first: the exception."""
        self._attempt_root = False
        """This attempt's first failure was a rank that raised (``_failed``)."""
        self._plain: dict[str, PlainTraceback] = {}
        """Tracebacks without a rank being read, per stream."""
        self._plain_errors: list[str] = []
        """The errors of this attempt's tracebacks without a rank, first first."""
        self._last_error: tuple[str, ...] | None = None
        """The errors of the failure counted last (``_check_progress``; ``_error_of``)."""
        self._last_exit: tuple[int | None, str | None] = (None, None)
        """Its exit code and signal."""
        self._attempt_blamed = False
        """A hang was blamed since this attempt's workers started."""

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
            self._new_attempt()
            self.launcher_error = None
            self.rendezvous_timeout = False
            self.usage_error = None

    def events_log(self, record: Event) -> None:
        """The events log's own report (a write that failed, or works again)."""
        if isinstance(record, EventsLogError):
            self.storage["events"] = f"the events log {record.path} cannot be written: {record.error}"
        elif isinstance(record, EventsLogResumed):
            self.storage.pop("events", None)

    def _new_attempt(self) -> None:
        self.attempt_started = self.clock()
        self._raised = {}
        self._attempt_root = False
        self._plain_errors = []
        self._attempt_blamed = False

    def line(self, text: str, *, stream: str = "") -> list[Event]:
        """Take one line of ft_launcher's output (in order within its ``stream``); returns the
        records to log, if it says something nvtrain acts on (a worker failure is logged once,
        with what else is known; first the rank that raised before it, when another did)."""
        if text.startswith(USAGE_ERROR):
            with self.lock:
                self.usage_error = text[len(USAGE_ERROR) :].strip()
            return []
        if self._traceback_line(text, stream):
            return []
        record = read_line(text)
        if record is None:
            return []
        with self.lock:
            if isinstance(record, WorkerFailed):
                return self._failed(record)
            if isinstance(record, LauncherError) and self._stop_asked(record):
                return []  # kept in the launcher's log (``LogSorter``), but not its error
            self._note(record)
        return [record]

    def _stop_asked(self, record: LauncherError) -> bool:
        """``record`` is ft_launcher ending on the signal that nvtrain forwarded to it: it
        re-raises its ``SignalException`` when a worker it stopped exited non-zero (143: every
        worker told to stop with SIGTERM), and says it ended with that exception. That is the
        stop asked for, not an error of ft_launcher's: no ``launcher_error``."""
        return self.signum is not None and record.error == SIGNAL_EXCEPTION

    def _traceback_line(self, text: str, stream: str) -> bool:
        """Follow the tracebacks in ``stream``: a plain script's, and the ranks that raised
        (their first and last lines); whether ``text`` was one of the latter (nothing more to
        read in it)."""
        plain = self._plain.setdefault(stream, PlainTraceback())
        error = plain.feed(text)
        if error is not None:
            with self.lock:
                self._plain_errors.append(error)
        raised = read_raised(text)
        if raised is None:
            return False
        with self.lock:
            if raised.error is None:
                self._raised.setdefault(raised.rank, None)
            elif raised.rank in self._raised:  # the last line of its traceback
                self._raised[raised.rank] = raised.error
        return True

    def _note(self, record: Event) -> None:
        """What a record of ft_launcher's (not a worker failure) tells: a new attempt, a restart
        or hang to check, a launcher error. Called with the lock held."""
        if isinstance(record, RendezvousDone):
            # The workers start right after it. Their own worker_start, when they log one,
            # is later and says so exactly; this is the start for scripts that log nothing.
            self._new_attempt()
            self.world_nodes = record.nodes
        elif isinstance(record, RestartBegin):
            self._restart_lines += 1
            self.hang_check = True
        elif isinstance(record, HangDetected):
            self.hang_check = self._hang_reported = True
            if record.local_rank is not None:
                self._hangs.add(record.local_rank)
            if record.rank is not None:
                self._hung_ranks.add(record.rank)
        elif isinstance(record, LauncherError):
            self.launcher_error = record.message
            self.rendezvous_timeout = record.error == RENDEZVOUS_TIMEOUT

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

    def _failed(self, record: WorkerFailed) -> list[Event]:
        pid = record.worker_pid
        if pid is not None:
            if pid in self._failed_pids:
                return []  # the same failure, logged again
            self._failed_pids.add(pid)
        self._read_workers()  # what the workers logged before ft_launcher saw them end
        rank = self._rank_of.get(pid) if pid is not None else None
        if rank is None and self.world_nodes == 1:
            rank = record.local_rank  # one node: the global rank is the local one
        hung = record.local_rank in self._hangs or (rank is not None and rank in self._hung_ranks)
        failure = dataclasses.replace(
            record,
            rank=rank,
            hang=True if hung else None,
            gave_up=self._gave_up.get(pid) if pid is not None else None,
            step=self.last_step,
            raised=self._raised.get(rank) if rank is not None else None,
        )
        if failure.exit_code == ExitCode.USAGE and failure.gave_up and self.worker_usage is None:
            # A refused call (worker.refusal): the same at every attempt, so the run stops now.
            error = failure.gave_up.removeprefix("usage error: ")
            self.worker_usage = f"{_named(failure)} refused the script's call: {error}"
            self._escalate(self.worker_usage, error)
        if hung:
            self.hang_check = self._hang_reported = True
        self._hangs.discard(record.local_rank)
        self._hung_ranks.discard(rank)
        root = self._raised_first(failure)
        if root is not None:
            self._attempt_root = True
            self._check_progress(root)
            self.failures.append(root)
        # Told to stop (it logged so, or this run is stopping: the signal went on to every worker,
        # plain scripts included): it ended on request, no fault.
        if (pid is not None and pid in self._stopped) or self.signum is not None:
            ended = WorkerEnded(**_exit_fields(failure), reason="stopped")
            self.ended.append(ended)
            return [root, ended] if root is not None else [ended]
        if not self._attempt_root:
            self._check_progress(failure)
        self.failures.append(failure)
        return [root, failure] if root is not None else [failure]

    def _raised_first(self, failure: WorkerFailed) -> WorkerFailed | None:
        """The failure of another rank of this node that raised an exception of its own before
        ``failure`` was seen, when there is one and ``failure`` is a worker that exited (not
        one killed by a signal: that one failed first, or was stopped) whose global rank is
        known. Its process may still be exiting: exit code and pid unknown (its own failure line
        may follow)."""
        if self._attempt_root or failure.signal is not None or failure.rank is None:
            return None
        first = next(
            (r for r, error in self._raised.items() if error is not None and not caused_by_peer(error)), None
        )
        if first is None or first == failure.rank:
            return None
        pid = next((p for p, r in self._rank_of.items() if r == first), None)
        return WorkerFailed(
            source="launcher",
            rank=first,
            local_rank=first if self.world_nodes == 1 else None,
            worker_pid=pid,
            raised=self._raised[first],
            step=self.last_step,
        )

    def _check_progress(self, failure: WorkerFailed) -> None:
        """Escalate when failures repeat without progress: at the same step when the workers
        report steps (the worker library does), else when the same local rank fails again in
        attempts that each ended within ``[heartbeat] initial_timeout`` (``STARTUP_LIMIT``
        when it is not set) of their start. An attempt that ran longer got past start-up, which
        counts as progress: the count of failures in a row starts again."""
        rank = _named(failure)
        previous, self._last_rank = self._last_rank, rank
        key, error = self._error_of(failure)
        exit = (failure.exit_code, failure.signal)
        previous_key, self._last_error = self._last_error, key
        previous_exit, self._last_exit = self._last_exit, exit
        limit = self.policy.restart.escalate_after
        step = failure.step
        if step is None:
            ran = self.clock() - self.attempt_started
            initial = self.policy.heartbeat.initial_timeout
            progressed = ran >= (initial if initial is not None else STARTUP_LIMIT)
            same = previous is not None and previous == rank
            self._same_rank = self._same_rank + 1 if same and not progressed else 1
            # A peer's fault (a connection refused, a collective that timed out) is not the
            # script's own, and may clear when the peer is back: counted only.
            identical = (
                self._same_rank >= 2
                and key is not None
                and key == previous_key
                and exit == previous_exit
                and not any(caused_by_peer(e) for e in key)
            )
            if identical and self._same_rank < limit:
                self._escalate(
                    f"{rank} failed {self._same_rank} times in a row before the first step, each "
                    f"time with the same error: {error}",
                    error,
                    early=True,
                )
            elif self._same_rank >= limit:
                within = (
                    f"[heartbeat] initial_timeout = {seconds(initial)}"
                    if initial is not None
                    else f"{seconds(STARTUP_LIMIT)} ([heartbeat] initial_timeout is not set)"
                )
                self._escalate(
                    f"{rank} failed {self._same_rank} times in a row, "
                    f"each time within {within} of its attempt's start "
                    "(the workers report no steps; an attempt that runs longer counts as progress)",
                    error,
                )
            return
        self._stalled = self._stalled + 1 if step == self._step_at_failure else 1
        self._step_at_failure = step
        if self._stalled >= limit:
            self._escalate(f"{self._stalled} failures in a row at step {step} (last: {rank})", error)

    def _escalate(self, reason: str, error: str | None, *, early: bool = False) -> None:
        if self.escalated is not None:
            return
        self.escalated_failures = self._same_rank if early or self.last_step is None else self._stalled
        self.escalated_error = error
        self.escalated_early = early
        self.escalated = reason

    def _error_of(self, failure: WorkerFailed) -> tuple[tuple[str, ...] | None, str | None]:
        """The script's error for ``failure``: (what to compare with the next failure's, the
        exception's line to show). What its rank raised (torch.distributed's traceback), else the
        errors of this attempt's tracebacks without a rank (an exception raised before
        ``init_process_group``), in the order printed; the last one is shown."""
        if failure.raised is not None:
            return (failure.raised,), failure.raised
        if not self._plain_errors:
            return None, None
        return tuple(self._plain_errors), self._plain_errors[-1]

    # -- hangs ----------------------------------------------------------------------------------

    def take_hang_check(self) -> tuple[bool, bool]:
        """(look for stopped workers now, a hang asked for it) once per hang or restart begun."""
        with self.lock:
            asked, hang = self.hang_check, self._hang_reported
            self.hang_check = self._hang_reported = False
        return asked, hang

    def local_ranks(self) -> tuple[int, ...]:
        """This node's local ranks: ``[job] nproc_per_node`` of them, or those seen failing or
        hanging when it is "gpu" or "cpu"."""
        nproc = self.policy.job.nproc_per_node
        if isinstance(nproc, int):
            return tuple(range(nproc))
        with self.lock:
            ended = (*self.failures, *self.ended)
            seen = {f.local_rank for f in ended if f.local_rank is not None} | self._hangs
        return tuple(sorted(seen))

    def rank_of(self, pid: int) -> int | None:
        """The global rank of this node's worker process ``pid``, if it logged its start."""
        with self.lock:
            return self._rank_of.get(pid)

    def blame(self, record: HangBlamed) -> None:
        """Note a hang the supervisor blamed on a worker (or on one of several)."""
        with self.lock:
            self.blames.append(record)
            self._attempt_blamed = True

    def blamed_this_attempt(self) -> bool:
        """Whether a hang was blamed since this attempt's workers started."""
        with self.lock:
            return self._attempt_blamed


def _exit_fields(record: WorkerFailed) -> dict[str, Any]:
    """The fields of a worker's exit (``records.WorkerExit``), the writer's among them."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def _named(failure: WorkerFailed) -> str:
    """ "local rank 1", or "rank 9" when only the global rank is known."""
    if failure.local_rank is None and failure.rank is not None:
        return f"rank {failure.rank}"
    return f"local rank {failure.local_rank}"

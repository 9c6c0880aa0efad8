"""Supervise one node: wait for DNS, start ft_launcher, pass signals on, escalate, report.

The loop reads top to bottom (``Supervisor.run``): wait for the store's DNS name -> start
ft_launcher in a session of its own -> echo its stdout and stderr, each to ours, and watch them
(``watch.Watch``); the launcher's own log lines go to the launcher log, and to the terminal only
when they are warnings or errors, or with ``-v`` (``logwatch.LogSorter``) -> on a signal, forward
it (SIGINT as SIGINT, which ft_launcher passes on to the workers; SIGTERM and SIGHUP as SIGTERM)
and allow ``stop_timeout`` -> on exit, kill every leftover descendant and say why the run ended
(``outcome.decide``) -> with ``[metrics]``, serve the final figures for ``[metrics] linger``
unless a signal ended the run (``linger``). A node that does not host the rendezvous store starts
ft_launcher again (re-resolving the store's name) when its launcher ends with an error rather
than a spent budget or NVRx 0.7's "do not restart": that is how the job outlives a replaced pod 0.
A rendezvous that did not gather its nodes within ``join_timeout`` is not retried here: it ends
with exit 3.

Escalation (``Watch`` decides it as it reads the failure that makes the count) freezes ft_launcher
at once with SIGSTOP, from the thread that read the line: ft_launcher ignores a SIGTERM that lands
between a restart's start and its rendezvous, and would start round after round. Its workers (and
rank monitors) are then stopped by nvtrain: TERM, ``stop_timeout``, KILL; then ft_launcher is
killed (``escalate``). A hang reported by a rank monitor, or any restart, makes the supervisor look
for workers that are stopped (``end_stalled``): such a worker is the one that hung (a peer blocked
in a collective misses its heartbeats too), it gets SIGKILL, since it cannot act on the SIGTERM
ft_launcher sends, and the hang is blamed on it (``hang_blamed``); when no process is stopped the
hang is blamed on one of the node's ranks.

``Supervisor`` is also the test seam (as torch.elastic tests its agent): a subclass replaces
``start_launcher``, ``kill_leftovers`` and ``resolve``, and passes a ``clock`` of its own, to run
the real loop without processes (``stop_escalated`` and ``end_stalled`` act on a process tree
only for a real ``process.Child``). ``supervise`` does the rest of ``nvtrain run``: the run's files
(``rundir``), the metrics endpoint, the events log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Protocol, TextIO

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode, NvtrainError, UsageError
from nvtrain.events import EventLog, EventTail, Reporter
from nvtrain.events.records import (
    DnsResolved,
    DnsWait,
    Escalated,
    Event,
    HangBlamed,
    KilledLeftovers,
    LauncherExit,
    LauncherOutputError,
    LauncherStart,
    LauncherStarted,
    MetricsLinger,
    Relaunch,
    SignalReceived,
)
from nvtrain.launcher import dns
from nvtrain.launcher.identity import Identity
from nvtrain.launcher.logwatch import LogSorter
from nvtrain.launcher.outcome import Outcome, decide, write_termination_log
from nvtrain.launcher.plan import LaunchPlan, uses_worker_library
from nvtrain.launcher.process import Child, become_subreaper, kill_all
from nvtrain.launcher.rundir import RunPaths, prepare, remove_state, unwritable_run_dir, write_state
from nvtrain.launcher.stalls import Stalls
from nvtrain.launcher.watch import Watch
from nvtrain.nvrx import NvrxVersion, installed_nvrx
from nvtrain.nvrx import inprocess as nvrx_inprocess

if TYPE_CHECKING:
    from nvtrain.live import MetricsServer

__all__ = [
    "POLL_INTERVAL",
    "STOP_GRACE",
    "launcher_log_path",
    "Launcher",
    "Outcome",
    "Reporter",
    "RunPaths",  # from rundir, as before it moved there
    "Supervisor",
    "launch_env",
    "linger",
    "lingers",
    "prepare",  # from rundir
    "supervise",
    "write_state",  # from rundir
]

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_TRACEBACK = "Traceback (most recent call last):"
_MAX_TMPDIR = 60
STOP_GRACE = 5.0
"""Seconds ft_launcher gets beyond ``stop_timeout`` to exit once told to stop."""
POLL_INTERVAL = 0.2
"""Seconds between two looks at ft_launcher and the workers' events."""
LINGER_AFTER = frozenset({ExitCode.OK, ExitCode.USAGE, ExitCode.ESCALATED})
"""Exit codes after which ``[metrics] linger`` applies: the pod's index is complete, or the Job
fails (docs/kubernetes.md). After the others Kubernetes replaces the pod, and the replacement
starts only once this one has ended."""


class Launcher(Protocol):
    """A running ft_launcher, as the supervisor uses it (``process.Child`` is one)."""

    @property
    def pid(self) -> int: ...

    def stdout_lines(self) -> Iterable[str]:
        """Its stdout (the workers' too), line by line, until it closes."""
        ...

    def stderr_lines(self) -> Iterable[str]:
        """Its stderr (the workers' too; its own log), line by line, until it closes."""
        ...

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit status once it has exited (``-N``: killed by signal N), waiting up to
        ``timeout`` seconds; None while it runs."""
        ...

    def send(self, signum: int) -> None: ...

    def stop(self, deadline: float) -> int:
        """SIGTERM it, wait until ``deadline`` (the supervisor's clock), then SIGKILL it and its
        tree; returns its exit status."""
        ...


class _Stopped(Exception):
    """A forwarded signal arrived while no launcher was running (during the DNS wait)."""


class Supervisor:
    """Supervises ft_launcher on this node until the run ends there (``run``).

    State: ``watch`` (what the run told us so far), ``launcher`` (the ft_launcher running now, if
    any), ``waiting_for_store`` (a signal then ends the DNS wait at once), ``relaunches``.

    Output: ft_launcher's stdout goes to ``out``, its stderr to ``err``, line by line; the
    launcher's own log lines (``LogSorter``) go to ``launcher_log`` and, unless ``verbose``,
    only its warnings and errors go on to ``out``/``err``.

    The seam, for tests without processes: ``start_launcher`` returns anything with the
    ``Launcher`` interface; ``kill_leftovers`` and ``resolve`` stand for the process table and
    DNS; ``clock`` (monotonic seconds; deadlines given to ``Launcher.stop`` are on it) and
    ``sleep`` (the DNS wait's backoff) stand for time. ``signalled`` is what a forwarded signal
    does; ``run`` installs it as the handler (so ``run`` must be called in the main thread).
    """

    def __init__(
        self,
        plan: LaunchPlan,
        policy: Policy,
        identity: Identity,
        events: EventLog,
        *,
        nvrx: NvrxVersion | None = None,
        env: Mapping[str, str] | None = None,
        report: Reporter | None = None,
        out: TextIO | None = None,
        err: TextIO | None = None,
        launcher_log: TextIO | None = None,
        verbose: bool = False,
        metrics_port: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.plan = plan
        self.policy = policy
        self.identity = identity
        self.events = events
        self.nvrx = nvrx
        self.env = dict(env) if env is not None else launch_env(plan)
        self.report: Reporter = report or (lambda record: None)
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.launcher_log = launcher_log
        self.verbose = verbose
        self._log_lock = threading.Lock()
        self.metrics_port = metrics_port
        self.clock = clock
        self.sleep = sleep
        # Only what the workers write from now on: an earlier life of this pod (same run, same
        # node) left its events in the log, and its pids may be reused by now.
        tail = EventTail(events.path)
        with contextlib.suppress(OSError):
            tail.offset = events.path.stat().st_size
        self.watch = Watch(
            policy,
            tail,
            self.report,
            node=identity.node_rank,
            host=str(events.common.get("host", socket.gethostname())),
            clock=clock,
        )
        self.stalls = Stalls(self.watch.rank_of)
        """The workers seen stopped (``end_stalled``)."""
        self.launcher: Launcher | None = None
        self.waiting_for_store = False
        self.relaunches = 0
        self.zygote: Child | None = None
        """The warm-start server of the running ft_launcher, if any."""
        self._escalation = threading.Lock()
        self._escalated = False
        """``escalate`` has frozen ft_launcher and logged why."""
        self.exit_code: int | None = None
        """The run's exit code once ``run`` has logged it (``launcher_exit``)."""

    # -- the seam -------------------------------------------------------------------------------

    def start_launcher(self) -> Launcher:
        """Start ft_launcher (``plan.argv``) in a session of its own, output captured. Its guard
        stops ft_launcher's tree should this process die without doing it (SIGKILL)."""
        return Child(self.plan.argv, self.env, capture=True, guard=self.plan.stop_timeout + STOP_GRACE)

    def start_zygote(self) -> Child | None:
        """Start the warm-start server (``plan.zygote``), if the policy asks for one, in a
        session of its own; ``stop_zygote`` ends it once ft_launcher has exited."""
        if not self.plan.zygote:
            return None
        return Child(self.plan.zygote, self.env, capture=False, guard=self.plan.stop_timeout + STOP_GRACE)

    def stop_zygote(self, zygote: Child) -> None:
        """End the warm-start server once ft_launcher has exited: SIGKILL, at once. It has nothing
        left to do or to save (its socket is in the run's state folder, removed with it; a
        worker it forked that still runs goes with the leftovers), and on SIGTERM it would exit
        through the interpreter's finalization, which takes a few tenths of a second with torch
        imported."""
        zygote.kill()

    def kill_leftovers(self) -> list[int]:
        """Stop every descendant left once ft_launcher has exited; returns the pids killed."""
        return kill_all(timeout=2.0)

    def resolve(self, name: str) -> list[str]:
        """The addresses of ``name`` now (raises ``OSError`` while it does not resolve)."""
        return dns.resolve(name)

    def _spared(self, launcher: Child) -> set[int]:
        """ft_launcher, the warm-start server and their guards: not workers."""
        spared = {launcher.pid}
        for child in (launcher, self.zygote):
            if child is not None:
                spared.add(child.pid)
                if child.guard is not None:
                    spared.add(child.guard.pid)
        return spared

    def stop_escalated(self, launcher: Launcher, deadline: float) -> int:
        """Stop a frozen ft_launcher's tree (its workers by ``deadline``, then itself); returns
        its exit status. A launcher that is not a ``Child`` (a test's) is asked to stop."""
        if isinstance(launcher, Child):
            return launcher.stop_frozen(deadline, keep=self._spared(launcher))
        return launcher.stop(deadline)

    def end_stalled(self, launcher: Launcher, *, now: bool) -> list[HangBlamed]:
        """Look at the workers' process states (``stalls.Stalls``: about once a second, or
        ``now``); when ``now``, SIGKILL the workers that are stopped and return a
        ``hang_blamed`` record for each, and for each seen stopped that has ended since. Nothing
        for a launcher that is not a ``Child`` (a test's: no process tree)."""
        if not isinstance(launcher, Child):
            return []
        spared = self._spared(launcher)
        if not now:
            self.stalls.look(spared)
            return []
        return [
            HangBlamed(
                source="launcher",
                rank=stalled.rank,
                local_rank=stalled.local_rank,
                worker_pid=stalled.pid,
                state=stalled.state,
                signal="SIGKILL" if killed else None,
            )
            for stalled, killed in self.stalls.take(spared)
        ]

    # -- running --------------------------------------------------------------------------------

    def emit(self, record: Event) -> None:
        """Log ``record`` and show it."""
        self.events.emit(record)
        self.report(record)

    def events_log_report(self, record: Event) -> None:
        """The events log's own report (``EventLog.report``): noted for the cause, shown."""
        self.watch.events_log(record)
        self.report(record)

    def signalled(self, signum: int) -> None:
        """A forwarded signal (SIGTERM, SIGINT, SIGHUP) reached ``nvtrain run``: recorded once,
        passed on to ft_launcher (``forwarded``), or, during the DNS wait, the end of the run."""
        if self.watch.signum is None:
            self.watch.signum = signum
            self.emit(SignalReceived(signal=signal.Signals(signum).name))
        if self.launcher is not None:
            self.launcher.send(forwarded(signum))
        elif self.waiting_for_store:
            raise _Stopped()

    def run(self) -> Outcome:
        """Run the plan on this node until it ends; returns the exit code and its cause, which
        are logged (``launcher_exit``) and written to the termination log. A ``DnsTimeout``
        (exit 3) is logged and written the same way, then raised for the caller to report."""
        self.emit(
            LauncherStart(
                argv=tuple(self.plan.argv),
                endpoint=self.plan.endpoint,
                is_host=self.plan.is_host,
                metrics_port=self.metrics_port,
            )
        )

        def handler(signum: int, _frame: FrameType | None) -> None:
            self.signalled(signum)

        previous = {s: signal.signal(s, handler) for s in _FORWARDED}
        try:
            code = self._loop()
        except _Stopped:
            code = -1
        except NvtrainError as exc:
            self._finish(int(exc.exit_code), str(exc))
            raise
        finally:
            for s, old in previous.items():
                signal.signal(s, old)
        w = self.watch
        outcome = decide(
            code, w, self.policy, self.identity, self.plan.endpoint, self.nvrx, storage=w.storage_problem()
        )
        self._finish(outcome.exit_code, outcome.cause)
        return outcome

    def _finish(self, exit_code: int, cause: str) -> None:
        self.exit_code = exit_code
        self.emit(LauncherExit(exit_code=exit_code, cause=cause))
        write_termination_log(cause, self.report)

    def _loop(self) -> int:
        while True:
            if self.watch.stopped():
                return -1
            if self.plan.wait_for:
                self._wait_for_store(self.plan.wait_for)
            code = self._run_launcher()
            if not self._relaunch(code):
                return code
            self.relaunches += 1
            self.emit(Relaunch(layer="launcher", reason=self.watch.launcher_error, attempt=self.relaunches))

    def _relaunch(self, code: int) -> bool:
        """Start ft_launcher again? Only on a node that does not host the store, after an error
        of ft_launcher's own (not a rendezvous timeout, NVRx's "do not restart", or an error
        after its workers used every in-job restart), while relaunches are left."""
        w = self.watch
        if w.stopped() or w.escalated or code == 0:
            return False
        if self.nvrx is not None and self.nvrx.is_no_restart_exit(code):
            return False
        if self.plan.is_host or w.launcher_error is None or w.rendezvous_timeout or w.budget_spent:
            return False
        return self.relaunches < self.policy.restart.in_job.max_restarts

    def _wait_for_store(self, name: str) -> None:
        def retrying(waited: float, error: str) -> None:
            self.report(DnsWait(target=name, error=error, waited=round(waited)))

        self.waiting_for_store = True
        try:
            addresses = dns.wait_until_resolvable(
                name,
                self.policy.rendezvous.dns_timeout,
                resolver=self.resolve,
                clock=self.clock,
                sleep=self.sleep,
                on_retry=retrying,
            )
        finally:
            self.waiting_for_store = False
        self.emit(DnsResolved(target=name, addresses=tuple(addresses)))

    def _run_launcher(self) -> int:
        self.watch.launcher_started()
        zygote = self.start_zygote()
        self.zygote = zygote
        launcher = self.start_launcher()
        self.launcher = launcher
        self.emit(LauncherStarted(launcher_pid=launcher.pid))
        if self.watch.signum is not None:  # a signal arrived between the DNS wait and the start
            launcher.send(forwarded(self.watch.signum))
        seen: set[str] = set()  # the launcher's warnings shown so far, from either stream
        failed: set[str] = set()
        readers = [
            threading.Thread(target=self._pump, args=(lines, dest, LogSorter(seen), failed), daemon=True)
            for lines, dest in ((launcher.stdout_lines(), self.out), (launcher.stderr_lines(), self.err))
        ]
        for reader in readers:
            reader.start()
        try:
            code = self._wait(launcher)
        finally:
            self.launcher = None
            self.zygote = None
            if zygote is not None:
                self.stop_zygote(zygote)
            leftovers = self.kill_leftovers()
            for reader in readers:
                reader.join(timeout=5.0)
        if leftovers:
            self.emit(KilledLeftovers(pids=tuple(leftovers)))
        return code

    def _wait(self, launcher: Launcher) -> int:
        deadline: float | None = None
        while True:
            code = launcher.wait(timeout=POLL_INTERVAL)
            self.watch.poll_workers()
            if code is not None:
                return code
            if self.watch.escalated:
                self.escalate()
                return self.stop_escalated(launcher, self.clock() + self.plan.stop_timeout)
            self._check_stalls(launcher)
            if self.watch.stopped():
                if deadline is None:
                    deadline = self.clock() + self.plan.stop_timeout + STOP_GRACE
                elif self.clock() >= deadline:
                    return launcher.stop(self.clock())

    def escalate(self) -> None:
        """Once the run escalated: freeze the running ft_launcher (SIGSTOP: it starts no new
        round; ``stop_escalated`` stops the rest) and log why (``escalated``). Called by the
        thread that read the failure that escalated, and by the supervisor's loop; acts once."""
        launcher = self.launcher
        with self._escalation:
            if self._escalated:
                return
            self._escalated = True
            if launcher is not None:
                launcher.send(signal.SIGSTOP)
        w = self.watch
        self.emit(Escalated(reason=w.escalated, failures=w.escalated_failures, error=w.escalated_error))

    def _check_stalls(self, launcher: Launcher) -> None:
        """After a hang report or a restart: end the workers that are stopped, and blame the hang
        on them; a hang with none stopped is blamed on one of the node's ranks (once an attempt)."""
        asked, hang = self.watch.take_hang_check()
        blamed = self.end_stalled(launcher, now=asked)
        if not asked:
            return
        if not hang:  # a restart alone: only a worker still stopped (it was ended here) tells
            blamed = [b for b in blamed if b.signal]
        if not blamed and hang and not self.watch.blamed_this_attempt():
            candidates = self.watch.local_ranks()
            if candidates:
                blamed = [HangBlamed(source="launcher", candidates=candidates)]
        for record in blamed:
            self.watch.blame(record)
            self.emit(record)

    def _pump(self, lines: Iterable[str], dest: TextIO, sorter: LogSorter, failed: set[str]) -> None:
        """Echo one of ft_launcher's streams to ``dest`` (the launcher's own log lines to the
        launcher log, and to ``dest`` as ``sorter`` says) and watch it until the pipe closes.
        Nothing may end this loop early: ft_launcher (and every worker writing to the same
        pipe) blocks once the unread pipe is full, and the job would hang. A failure is
        reported once per kind (``failed``, shared by both streams) and the loop goes on."""
        stream = "stdout" if dest is self.out else "stderr"
        held: str | None = None
        """A traceback's first line, hidden as the launcher's, that may turn out a worker's."""
        for text in lines:
            try:
                launchers, shown = sorter.sort(text)
            except Exception as exc:  # noqa: BLE001 - any: the pipe must be drained (see above)
                self._failed_once(failed, "sorting", exc)
                launchers, shown = False, True
            echoed = text
            if held is not None and not launchers:
                # A script's traceback that came right after a launcher record it is not part of
                # (``LogSorter`` tells by its first frame): its first line is shown after all.
                echoed = held + text
            held = text if launchers and not shown and text.rstrip("\r\n") == _TRACEBACK else None
            if launchers and self.launcher_log is not None:
                try:
                    with self._log_lock:
                        self.launcher_log.write(text)
                        self.launcher_log.flush()
                except Exception as exc:  # noqa: BLE001 - any: the pipe must be drained (see above)
                    self._failed_once(failed, "logging", exc)
            if shown or self.verbose:
                try:
                    dest.write(text if self.verbose else echoed)
                    dest.flush()
                except Exception as exc:  # noqa: BLE001 - any: the pipe must be drained (see above)
                    self._failed_once(failed, "echoing", exc)
            try:
                for record in self.watch.line(text, stream=stream):
                    self.emit(record)
                if self.watch.escalated:
                    self.escalate()
            except Exception as exc:  # noqa: BLE001 - any: the pipe must be drained (see above)
                self._failed_once(failed, "reading events from", exc)

    def _failed_once(self, failed: set[str], doing: str, exc: Exception) -> None:
        if doing in failed:
            return
        failed.add(doing)
        error = f"{doing} ft_launcher's output: {type(exc).__name__}: {exc} (reported once; goes on)"
        with contextlib.suppress(Exception):  # the report goes to stderr, which may be what fails
            self.report(LauncherOutputError(error=error))


def forwarded(signum: int) -> int:
    """The signal ft_launcher gets for ``signum`` reaching ``nvtrain run``: SIGINT stays SIGINT
    (torch elastic's agent stops its workers with the signal it got, so a script's ``except
    KeyboardInterrupt:`` runs, as under torchrun); SIGTERM and SIGHUP become SIGTERM."""
    return signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM


def launcher_log_path(paths: RunPaths, node: int) -> Path:
    """Where ``nvtrain run`` on node ``node`` writes ft_launcher's own log lines."""
    return paths.run_dir / f"launcher-node{node}.log"


def launch_env(plan: LaunchPlan) -> dict[str, str]:
    """ft_launcher's environment: the plan's defaults, this process's environment, the plan's
    (its ``TMPDIR``, a private folder short enough for NVRx's sockets, wins)."""
    env = {**plan.env_defaults, **os.environ, **plan.env}
    if "TMPDIR" not in plan.env and len(tempfile.gettempdir()) > _MAX_TMPDIR:
        # NVRx puts its Unix sockets in $TMPDIR; a long path breaks them silently (108 bytes).
        env["TMPDIR"] = "/tmp"
    return env


def supervise(
    plan: LaunchPlan,
    policy: Policy,
    identity: Identity,
    paths: RunPaths,
    *,
    out: TextIO | None = None,
    report: Reporter | None = None,
    verbose: bool = False,
) -> Outcome:
    """Run ``plan`` on this node until it ends; returns the exit code and its cause.

    Writes the run's state first (``write_state``), serves metrics if the policy asks, and
    removes the state when the run ends; the final figures are then served for ``[metrics]
    linger`` more, unless a signal stopped the run (``linger``). ft_launcher's own log lines go to
    ``<run dir>/launcher-node<N>.log`` (appended to), and to the terminal only when they are
    warnings or errors, or when ``verbose``. A ``DnsTimeout`` (exit 3) is recorded in the events log
    and the termination log, then raised for the caller to report.
    """
    nvrx = installed_nvrx()
    wanted = policy.restart.in_process.enabled and uses_worker_library(policy.job)
    if wanted and not nvrx_inprocess.available():
        logging.getLogger(__name__).warning(nvrx_inprocess.missing_note(f"NVRx {nvrx}"))
    write_state(policy, paths)
    try:
        metrics = _serve_metrics(policy, identity, paths)
        try:  # makes the run's folder, written a moment ago: fails only if it fails now
            events = EventLog(
                paths.events, node=identity.node_rank, run_id=identity.run_id, source="launcher"
            )
            launcher_log = launcher_log_path(paths, identity.node_rank).open(
                "a", encoding="utf-8", errors="replace"
            )
        except OSError as exc:
            if metrics:
                metrics.close()
            raise unwritable_run_dir(policy, paths.run_dir, exc) from None
    except BaseException:
        remove_state(paths)
        raise
    supervisor: Supervisor | None = None
    try:
        supervisor = Supervisor(
            plan,
            policy,
            identity,
            events,
            nvrx=nvrx,
            report=report,
            out=out,
            launcher_log=launcher_log,
            verbose=verbose,
            metrics_port=metrics.port if metrics else None,
        )
        # A failed write (full checkpoint volume) is reported, never raised; and noted for the cause.
        events.report = supervisor.events_log_report
        become_subreaper()
        return supervisor.run()
    finally:
        remove_state(paths)
        launcher_log.close()
        if metrics:
            if supervisor is not None and lingers(supervisor.exit_code, supervisor.watch.signum):
                linger(metrics, policy.metrics.linger, supervisor.report)
            metrics.close()


def lingers(exit_code: int | None, signum: int | None) -> bool:
    """Whether the final figures are served for ``[metrics] linger`` once the run logged its
    ``exit_code``: not when a signal (``signum``) stopped it, the pod being deleted, nor after an
    exit that Kubernetes answers with a replacement pod (``LINGER_AFTER``)."""
    return signum is None and exit_code in LINGER_AFTER


def linger(
    metrics: MetricsServer,
    seconds: float,
    report: Reporter,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Serve the run's final figures, its exit code among them, for ``seconds`` more
    (``[metrics] linger``), so that a scrape after the end sees how the run ended. SIGTERM,
    SIGINT or SIGHUP (the pod being deleted, Ctrl-C) ends the wait within ``POLL_INTERVAL``: the
    pod's termination grace period is never spent here. Call it in the main thread."""
    stopped: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        stopped.append(signum)  # no lock, no raise: it may run anywhere in the loop below

    previous = {s: signal.signal(s, handler) for s in _FORWARDED}
    try:
        metrics.catch_up()
        report(MetricsLinger(port=metrics.port, seconds=seconds))
        deadline = clock() + seconds
        while not stopped and (left := deadline - clock()) > 0:
            sleep(min(left, POLL_INTERVAL))
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def _serve_metrics(policy: Policy, identity: Identity, paths: RunPaths) -> MetricsServer | None:
    """Start the Prometheus endpoint when the policy asks for it; a port that cannot be bound
    is a usage error (exit 2) naming the key, before any worker starts."""
    if not policy.metrics.enabled:
        return None
    from nvtrain.live import bind_address, serve

    try:
        return serve(
            policy.metrics,
            paths.run_dir,  # every pod's events log: the whole job's figures
            run_id=identity.run_id,
            node_rank=identity.node_rank,
            address=bind_address(os.environ.get("POD_IP")),
        )
    except OSError as exc:
        raise UsageError(
            f"[metrics] port = {policy.metrics.port}: cannot serve metrics on it ({exc.strerror or exc})",
            "choose a free port in [metrics] port, or set [metrics] enabled = false",
        ) from None

"""The supervisor's real loop (``Supervisor.run``) with a fake ft_launcher: relaunch, escalation,
signals and the root cause, without processes.

The fake is a test subclass, as torch.elastic tests its agent: ``start_launcher`` returns a
scripted launcher, ``resolve`` answers at once, ``kill_leftovers`` finds nothing, and one clock,
moved by the script, is all the time there is. Each look of the supervisor at the launcher (one
``wait``) plays one ``Tick``: the workers append their events to the real events log through a
real ``EventLog``, ft_launcher prints its lines (the supervisor's reader thread has read them all
when the tick ends), a signal reaches this process, ft_launcher exits. The log lines are NVRx
0.4.1's own (see test_logwatch.py).
"""

from __future__ import annotations

import dataclasses
import io
import os
import queue
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode
from nvtrain.events import Event, EventLog, read_events
from nvtrain.events.records import (
    CheckpointCommitted,
    CheckpointFailed,
    DnsWait,
    FaultInjected,
    LauncherExit,
    LauncherStart,
    Relaunch,
    RestartBegin,
    SignalReceived,
    Step,
    TerminationLogError,
    WorkerEnded,
    WorkerFailed,
    WorkerGaveUp,
    WorkerStart,
    WorkerStopped,
)
from nvtrain.launcher.dns import DnsTimeout
from nvtrain.launcher.identity import identify
from nvtrain.launcher.outcome import Outcome
from nvtrain.launcher.rundir import prepare
from nvtrain.launcher.supervisor import POLL_INTERVAL, STOP_GRACE, Launcher, Supervisor
from nvtrain.nvrx import NvrxVersion
from nvtrain.runlog import pod_events_file

V041, V070 = NvrxVersion.parse("0.4.1"), NvrxVersion.parse("0.7.0")
E = TypeVar("E", bound=Event)
RUN_ID = "run-1"

# -- ft_launcher's lines (NVRx 0.4.1) ----------------------------------------------------------


def joined(round_: int, nodes: int = 1) -> str:
    return (
        f"[2026-11-29 10:23:33,685] [INFO] [ft_launcher9108@vm] The node 'vm_9108_0' has joined "
        f"round {round_} of the rendezvous 'b1' as rank 0 in a world of size {nodes}."
    )


def failed(pid: int, local_rank: int = 1, code: int = 3) -> str:
    return (
        f"[2026-11-29 10:24:14,414] [ERROR] [ft_launcher9527@vm] failed (exitcode: {code}) local_rank: "
        f"{local_rank} (pid: {pid}) of binary: /usr/bin/python"
    )


def unhealthy(left: int, limit: int) -> str:
    return (
        f"[2026-11-29 10:23:33,190] [INFO] [ft_launcher9108@vm] [default] Worker group UNHEALTHY. "
        f"{left}/{limit} attempts left; will restart worker group"
    )


def hang(local_rank: int) -> str:
    return (
        f"[2026-11-29 10:23:51,003] [WARNING] [RankMonServer9210@vm:{local_rank}] Did not get subsequent "
        "heartbeat. Waited 4.00 seconds."
    )


AGENT_ERROR = (
    "[2026-11-29 10:21:12,004] [ERROR] [ft_launcher7418@vm] Agent run ended with exception, "
    "e=RendezvousConnectionError('The connection to the C10d store has failed. See inner exception "
    "for details.'). Agent's exit code = 1"
)
RENDEZVOUS_TIMED_OUT = (
    "[2026-12-01 14:41:57,243] [ERROR] [ft_launcher13764@vm] Agent run ended with exception, "
    "e=RendezvousTimeoutError(). Agent's exit code = 1"
)
CHATTER = "[2026-11-29 10:23:33,190] [INFO] [ft_launcher9108@vm] Stopping workers... Timeout = 3.0 sec."

# -- the fakes ------------------------------------------------------------------------------------


class Clock:
    """The only time there is: moved by the launcher's script and by the DNS wait's sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclasses.dataclass
class Tick:
    """What happens during one ``wait`` of the supervisor, in this order."""

    workers: Sequence[tuple[EventLog, Event]] = ()
    """Events the workers append to the log."""
    lines: Sequence[str] = ()
    """Lines ft_launcher prints."""
    signal: int | None = None
    """A signal sent to this process (the supervisor's handler forwards it)."""
    exit: int | None = None
    """ft_launcher exits with this status."""
    seconds: float = POLL_INTERVAL
    """How long it all takes."""


class FakeLauncher:
    """A scripted ft_launcher with the ``Launcher`` interface. Once its ticks are played it runs
    on, saying nothing, until it exits on SIGTERM (``on_term``) or is stopped."""

    def __init__(self, clock: Clock, ticks: Sequence[Tick], *, on_term: int | None, pid: int) -> None:
        self.clock = clock
        self.ticks = list(ticks)
        self.on_term = on_term
        self.pid = pid
        self.code: int | None = None
        self.sent: list[int] = []
        self.stops: list[tuple[float, float]] = []
        """(deadline, clock) of each ``stop``."""
        self._output: queue.Queue[str | None] = queue.Queue()

    def stdout_lines(self) -> Iterator[str]:
        return iter(())  # NVRx logs to stderr; the workers here print nothing

    def stderr_lines(self) -> Iterator[str]:
        while True:
            line = self._output.get()
            try:
                if line is None:
                    return
                yield line
            finally:  # runs once the reader asks for the next line: this one is processed
                self._output.task_done()

    def wait(self, timeout: float | None = None) -> int | None:
        if self.code is not None:
            return self.code
        if not self.ticks:
            self.clock.now += timeout or 0.0
            return None
        tick = self.ticks.pop(0)
        self.clock.now += tick.seconds
        for log, record in tick.workers:
            log.emit(record)
        for line in tick.lines:
            self._output.put(line + "\n")
        self._output.join()  # the supervisor has read every line
        if tick.signal is not None:
            os.kill(os.getpid(), tick.signal)  # its handler runs before the next line here
        if tick.exit is not None:
            self._exit(tick.exit)
        return self.code

    def send(self, signum: int) -> None:
        self.sent.append(signum)
        if signum in (signal.SIGTERM, signal.SIGINT) and self.on_term is not None and self.code is None:
            self._exit(self.on_term)

    def stop(self, deadline: float) -> int:
        self.stops.append((deadline, self.clock.now))
        if self.code is None:
            self._exit(self.on_term if self.on_term is not None else -signal.SIGKILL)
        assert self.code is not None
        return self.code

    def _exit(self, code: int) -> None:
        self.code = code
        self._output.put(None)


@dataclasses.dataclass
class Script:
    """One ft_launcher's life: its ticks and its answer to SIGTERM (None: ignores it)."""

    ticks: Sequence[Tick]
    on_term: int | None = 1


class FakeSupervisor(Supervisor):
    """The real supervisor with the process table, DNS and time replaced."""

    def __init__(self, *args: Any, scripts: Sequence[Script], clock: Clock, **kwargs: Any) -> None:
        super().__init__(*args, clock=clock, sleep=clock.sleep, **kwargs)
        self.fake_clock = clock
        self.scripts = list(scripts)
        self.started: list[FakeLauncher] = []
        self.resolved: list[str] = []
        self.addresses: list[str] | None = ["10.0.0.1"]
        """What ``resolve`` answers (None: the name does not resolve)."""
        self.on_resolve: int | None = None
        """A signal sent to this process while resolving."""

    def start_launcher(self) -> Launcher:
        script = self.scripts.pop(0)
        launcher = FakeLauncher(
            self.fake_clock, script.ticks, on_term=script.on_term, pid=9000 + len(self.started)
        )
        self.started.append(launcher)
        return launcher

    def kill_leftovers(self) -> list[int]:
        return []

    def start_zygote(self) -> None:
        """No warm-start server (on by default): the launchers here are fakes."""
        return None

    def resolve(self, name: str) -> list[str]:
        self.resolved.append(name)
        if self.on_resolve is not None:
            os.kill(os.getpid(), self.on_resolve)
        if self.addresses is None:
            raise OSError("Name or service not known")
        return self.addresses


def policy(tmp_path: Path, *, nodes: int = 1, escalate_after: int = 3, max_restarts: int = 5) -> Policy:
    return Policy.model_validate(
        {
            "job": {"name": "trainer", "script": "train.py", "stop_timeout": "10s"},
            "rendezvous": {"nodes": nodes, "join_timeout": "5s", "dns_timeout": "30s"},
            "heartbeat": {"initial_timeout": "20s", "timeout": "4s"},
            "restart": {"escalate_after": escalate_after, "in_job": {"max_restarts": max_restarts}},
            "checkpoint": {"dir": str(tmp_path / "ckpt")},
        }
    )


@dataclasses.dataclass
class Node:
    """One node's supervisor, what it showed and printed, and its workers' logs."""

    supervisor: FakeSupervisor
    shown: list[Event]
    out: io.StringIO
    err: io.StringIO
    launcher_log: io.StringIO
    events: Path

    def run(self) -> Outcome:
        return self.supervisor.run()

    def worker(self, pid: int, **common: Any) -> EventLog:
        """The events log as a worker process ``pid`` of this node writes it."""
        return EventLog(self.events, run_id=RUN_ID, source="worker", pid=pid, **common)

    def logged(self, kind: type[E]) -> list[E]:
        """The log's records of type ``kind`` (``Event``: all)."""
        return [e for e in read_events(self.events) if isinstance(e, kind)]


def node(
    tmp_path: Path,
    scripts: Sequence[Script],
    *,
    rank: int = 0,
    nvrx: NvrxVersion = V041,
    verbose: bool = False,
    **settings: Any,
) -> Node:
    p = policy(tmp_path, **settings)
    identity = identify(
        p, {"JOB_COMPLETION_INDEX": str(rank), "NVTRAIN_RUN_ID": RUN_ID}, hostname=f"trainer-{rank}"
    )
    plan, paths = prepare(p, identity, nvrx=nvrx)
    events = EventLog(paths.events, node=rank, run_id=RUN_ID, source="launcher")
    shown: list[Event] = []
    out, err, launcher_log = io.StringIO(), io.StringIO(), io.StringIO()
    supervisor = FakeSupervisor(
        plan,
        p,
        identity,
        events,
        nvrx=nvrx,
        env={},
        report=shown.append,
        out=out,
        err=err,
        launcher_log=launcher_log,
        verbose=verbose,
        scripts=scripts,
        clock=Clock(),
    )
    events.report = supervisor.events_log_report
    return Node(supervisor, shown, out, err, launcher_log, paths.events)


def attempts(durations: Sequence[float], *, wait: float = 1.0, local_rank: int = 1) -> list[Tick]:
    """Each attempt: its rendezvous completes after ``wait`` seconds, then ``local_rank`` fails
    (exit code 3) after the given duration, and ft_launcher restarts the workers."""
    ticks = []
    for n, duration in enumerate(durations):
        ticks.append(Tick(seconds=wait, lines=[joined(n)]))
        ticks.append(Tick(seconds=duration, lines=[failed(5000 + n, local_rank), unhealthy(5 - n, 5)]))
    return ticks


# -- a run that ends by itself ---------------------------------------------------------------------


def test_a_clean_run_logs_its_start_and_end_and_echoes_ft_launchers_output(tmp_path: Path) -> None:
    n = node(tmp_path, [Script([Tick(lines=[joined(0), CHATTER]), Tick(exit=0)])])
    outcome = n.run()
    assert outcome == Outcome(0, f"run {RUN_ID} finished on pod trainer-0 (node 0)")
    logged = n.logged(Event)
    assert isinstance(logged[0], LauncherStart) and logged[0].is_host
    names = ["launcher_start", "launcher_started", "rendezvous_done", "launcher_exit"]
    assert [e.name for e in logged] == names
    assert [e.name for e in n.shown] == names  # every record logged is shown
    end = logged[-1]
    assert isinstance(end, LauncherExit) and (end.exit_code, end.cause) == (0, outcome.cause)
    # ft_launcher's INFO lines go to the launcher log only
    assert (n.out.getvalue(), n.err.getvalue()) == ("", "")
    assert n.launcher_log.getvalue() == f"{joined(0)}\n{CHATTER}\n"


@pytest.mark.parametrize("verbose", [False, True])
def test_the_launchers_warnings_are_shown_once_and_its_info_with_v(tmp_path: Path, verbose: bool) -> None:
    warning = "[2026-12-02 09:15:22,556] [WARNING] [ft_launcher12528@vm] GPU Health checks disabled"
    lines = [joined(0), warning, "WORKER said this", warning.replace("09:15:22", "09:15:27"), CHATTER]
    n = node(tmp_path, [Script([Tick(lines=lines), Tick(exit=0)])], verbose=verbose)
    assert n.run().exit_code == 0
    everything = "".join(line + "\n" for line in lines)
    shown = everything if verbose else f"{warning}\nWORKER said this\n"
    assert n.err.getvalue() == shown
    assert n.launcher_log.getvalue() == everything.replace("WORKER said this\n", "")


# -- relaunch of a node that does not host the store -------------------------------------------------


def test_a_non_host_node_relaunches_after_a_launcher_error(tmp_path: Path) -> None:
    lost_store = Script([Tick(lines=[joined(0, nodes=2)]), Tick(lines=[AGENT_ERROR], exit=1)])
    n = node(
        tmp_path, [lost_store, Script([Tick(lines=[joined(0, nodes=2)]), Tick(exit=0)])], rank=1, nodes=2
    )
    outcome = n.run()
    assert outcome.exit_code == 0
    assert len(n.supervisor.started) == 2
    store = "trainer-0.trainer.default.svc.cluster.local"
    assert n.supervisor.resolved == [store, store]  # the store's name is resolved again
    [relaunch] = n.logged(Relaunch)
    assert relaunch.attempt == 1 and relaunch.layer == "launcher"
    assert relaunch.reason is not None and relaunch.reason.startswith("e=RendezvousConnectionError(")


@pytest.mark.parametrize(
    ("case", "rank", "nvrx", "line", "code", "expected"),
    [
        ("rendezvous timeout", 1, V041, RENDEZVOUS_TIMED_OUT, 1, ExitCode.RENDEZVOUS),
        ("the host", 0, V041, AGENT_ERROR, 1, ExitCode.FAILED),
        ("exit 93 of NVRx 0.7", 1, V070, AGENT_ERROR, 93, ExitCode.ESCALATED),
        ("no error: the budget is spent", 1, V041, failed(5001), 1, ExitCode.FAILED),
    ],
)
def test_no_relaunch(
    tmp_path: Path, case: str, rank: int, nvrx: NvrxVersion, line: str, code: int, expected: int
) -> None:
    n = node(tmp_path, [Script([Tick(lines=[line], exit=code)])], rank=rank, nodes=2, nvrx=nvrx)
    assert n.run().exit_code == expected, case
    assert len(n.supervisor.started) == 1 and not n.logged(Relaunch)


def test_relaunches_stop_when_the_restart_budget_is_spent(tmp_path: Path) -> None:
    error = Script([Tick(lines=[AGENT_ERROR], exit=1)])
    n = node(tmp_path, [error, error, error], rank=1, nodes=2, max_restarts=1)
    outcome = n.run()
    assert outcome.exit_code == ExitCode.FAILED
    assert outcome.cause.startswith(
        "ft_launcher failed on pod trainer-1 (node 1): e=RendezvousConnectionError("
    )
    assert len(n.supervisor.started) == 2
    assert [r.attempt for r in n.logged(Relaunch)] == [1]


# -- escalation: failures that repeat without progress -------------------------------------------------


def test_failures_in_a_row_at_the_same_step_escalate(tmp_path: Path) -> None:
    n = node(tmp_path, [], escalate_after=2)
    w0, w1 = n.worker(5000), n.worker(5001)
    ticks = []
    for attempt in range(3):
        ticks.append(
            Tick(lines=[joined(attempt)], workers=[(w0, WorkerStart(rank=0, restart_count=attempt))])
        )
        ticks.append(Tick(workers=[(w1, Step(rank=1, step=40, step_s=0.1))], lines=[failed(6000 + attempt)]))
    n.supervisor.scripts = [Script(ticks)]
    outcome = n.run()
    assert outcome.exit_code == ExitCode.ESCALATED
    assert "2 failures in a row at step 40 (last: local rank 1)" in outcome.cause
    assert "[restart] escalate_after = 2" in outcome.cause and "not retrying" in outcome.cause
    [launcher] = n.supervisor.started
    assert launcher.stops == [(n.supervisor.fake_clock.now + 10.0, n.supervisor.fake_clock.now)]
    assert launcher.ticks  # stopped before its third attempt
    assert [f.step for f in n.logged(WorkerFailed)] == [40, 40]


def test_a_new_step_between_failures_is_progress(tmp_path: Path) -> None:
    n = node(tmp_path, [], escalate_after=2)
    w1 = n.worker(5001)
    ticks = [
        Tick(workers=[(w1, Step(rank=1, step=step))], lines=[failed(6000 + step), unhealthy(2, 5)])
        for step in (40, 50, 60)
    ]
    n.supervisor.scripts = [Script([*ticks, Tick(exit=0)])]
    assert n.run().exit_code == 0
    assert [f.step for f in n.logged(WorkerFailed)] == [40, 50, 60]


def test_quick_failures_of_the_same_rank_escalate_when_no_steps_are_reported(tmp_path: Path) -> None:
    n = node(tmp_path, [Script([*attempts([2.0, 2.0, 2.0]), Tick(exit=0)])], escalate_after=2)
    outcome = n.run()
    assert outcome.exit_code == ExitCode.ESCALATED
    assert "local rank 1 failed 2 times in a row" in outcome.cause
    assert "[heartbeat] initial_timeout = 20s" in outcome.cause
    assert len(n.logged(WorkerFailed)) == 2


def test_attempts_that_ran_past_initial_timeout_count_as_progress(tmp_path: Path) -> None:
    # benchmarks/recovery/RESULTS.md: a plain torchrun script failing at steps 15, 30 and 45 of
    # 60 was stopped with exit 4 although it made progress between the failures. Progress only
    # resets the count: two quick failures after it escalate again.
    n = node(tmp_path, [Script([*attempts([30.0, 25.0, 20.0, 1.0, 1.0]), Tick(exit=0)])], escalate_after=2)
    assert n.run().exit_code == ExitCode.ESCALATED
    assert len(n.logged(WorkerFailed)) == 4


def test_waiting_for_the_rendezvous_is_not_progress(tmp_path: Path) -> None:
    # The attempt runs from its completed rendezvous, not from the restart: a long wait for the
    # other nodes followed by a quick failure is no progress.
    n = node(tmp_path, [Script([*attempts([1.0, 1.0], wait=60.0), Tick(exit=0)])], escalate_after=2)
    assert n.run().exit_code == ExitCode.ESCALATED


def test_an_attempt_starts_when_its_workers_say_so(tmp_path: Path) -> None:
    # Workers that log worker_start (the worker library) date their attempt themselves: 30 s
    # after the rendezvous they had not started yet, so a failure 5 s after their start is quick
    # (the rendezvous line alone would have made it a 35 s attempt, past initial_timeout = 20 s).
    n = node(tmp_path, [], escalate_after=2)
    ticks = []
    for attempt in range(2):
        here = n.worker(5000 + attempt)
        ticks += [
            Tick(seconds=1.0, lines=[joined(attempt)]),
            Tick(seconds=30.0, workers=[(here, WorkerStart(rank=1, restart_count=attempt))]),
            Tick(seconds=5.0, lines=[failed(5000 + attempt)]),
        ]
    n.supervisor.scripts = [Script([*ticks, Tick(exit=0)])]
    assert n.run().exit_code == ExitCode.ESCALATED


def test_the_same_attempts_dated_by_the_rendezvous_made_progress(tmp_path: Path) -> None:
    # A plain script logs no events: its attempts run from the rendezvous, 35 s each. The
    # workers of another node (same shared log) starting meanwhile date nothing here.
    n = node(tmp_path, [], escalate_after=2)
    elsewhere = n.worker(7000, node=1)
    ticks = []
    for attempt in range(2):
        ticks += [
            Tick(seconds=1.0, lines=[joined(attempt)]),
            Tick(seconds=30.0, workers=[(elsewhere, WorkerStart(rank=3, restart_count=attempt))]),
            Tick(seconds=5.0, lines=[failed(5000 + attempt)]),
        ]
    n.supervisor.scripts = [Script([*ticks, Tick(exit=0)])]
    assert n.run().exit_code == 0


# -- signals -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_is_forwarded_to_ft_launcher(tmp_path: Path, signum: int) -> None:
    n = node(tmp_path, [Script([Tick(lines=[joined(0)]), Tick(signal=signum)], on_term=1)])
    handler = signal.getsignal(signum)
    outcome = n.run()
    assert signal.getsignal(signum) is handler  # restored
    assert outcome.exit_code == 128 + signum
    name = signal.Signals(signum).name
    assert (
        outcome.cause == f"stopped by {name} on pod trainer-0 (node 0); the workers were asked to stop first"
    )
    [launcher] = n.supervisor.started
    # SIGINT stays SIGINT (ft_launcher passes it on to the workers); the others become SIGTERM
    assert launcher.sent == [signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM]
    assert not launcher.stops
    assert [s.signal for s in n.logged(SignalReceived)] == [name]


def test_ft_launcher_is_stopped_once_the_deadline_has_passed(tmp_path: Path) -> None:
    n = node(tmp_path, [Script([Tick(lines=[joined(0)]), Tick(signal=signal.SIGTERM)], on_term=None)])
    clock = n.supervisor.fake_clock
    signalled_at = clock.now + 2 * POLL_INTERVAL
    outcome = n.run()
    assert outcome.exit_code == 143
    [launcher] = n.supervisor.started
    assert launcher.sent == [signal.SIGTERM]
    [(deadline, at)] = launcher.stops
    # stop_timeout (10 s) + STOP_GRACE after the signal, to the next look; and then no waiting
    assert signalled_at + 10.0 + STOP_GRACE <= at < signalled_at + 10.0 + STOP_GRACE + 2 * POLL_INTERVAL
    assert deadline == at
    assert launcher.code == -signal.SIGKILL


def test_a_signal_during_the_dns_wait_ends_the_run(tmp_path: Path) -> None:
    n = node(tmp_path, [], rank=1, nodes=2)
    n.supervisor.on_resolve = signal.SIGTERM
    outcome = n.run()
    assert outcome.exit_code == 143 and not n.supervisor.started
    assert [e.name for e in n.logged(Event)] == ["launcher_start", "signal", "launcher_exit"]


def test_a_pod_0_name_that_never_resolves_ends_with_exit_3(tmp_path: Path) -> None:
    n = node(tmp_path, [], rank=1, nodes=2)
    n.supervisor.addresses = None
    with pytest.raises(DnsTimeout) as raised:
        n.run()
    assert raised.value.exit_code == ExitCode.RENDEZVOUS
    assert n.supervisor.fake_clock.now >= 1030.0  # dns_timeout = 30s, slept on the fake clock
    assert any(isinstance(e, DnsWait) for e in n.shown)
    [end] = n.logged(LauncherExit)
    assert end.exit_code == 3 and end.cause == str(raised.value)


# -- root cause ------------------------------------------------------------------------------------------


def test_the_cause_names_the_first_failing_rank(tmp_path: Path) -> None:
    ticks = [
        Tick(lines=[joined(0)]),
        Tick(lines=[failed(5001, local_rank=1, code=-9), unhealthy(1, 1)]),
        Tick(lines=[joined(1)]),
        Tick(lines=[failed(5010, local_rank=0, code=1)], exit=1),
    ]
    n = node(tmp_path, [Script(ticks)], max_restarts=1, escalate_after=5)
    outcome = n.run()
    assert outcome.exit_code == ExitCode.FAILED
    assert outcome.cause.startswith(
        "workers failed; 1/1 in-job restarts used. Root cause (first failure): local rank 1 on pod "
        "trainer-0 (node 0), killed by SIGKILL (pid 5001); 2 worker failure(s) in all. SIGKILL often "
        "means the OOM killer"
    ), outcome.cause


def test_a_hang_is_named_as_the_cause(tmp_path: Path) -> None:
    ticks = [
        Tick(lines=[joined(0), hang(1)]),
        Tick(lines=[failed(5001, local_rank=1, code=-9), unhealthy(1, 1)]),
        Tick(lines=[joined(1)]),
        Tick(lines=[failed(5011, local_rank=1, code=-9)], exit=1),
    ]
    n = node(tmp_path, [Script(ticks)], max_restarts=1, escalate_after=5)
    outcome = n.run()
    assert (
        "killed by SIGKILL after its heartbeats stopped (hang detected by the rank monitor) (pid 5001)"
        in outcome.cause
    )
    assert "OOM" not in outcome.cause
    assert [f.hang for f in n.logged(WorkerFailed)] == [True, None]  # the next failure hung no more


def test_a_worker_told_to_stop_is_not_the_root_cause(tmp_path: Path) -> None:
    n = node(tmp_path, [], escalate_after=2)
    stopped = n.worker(5000)
    ticks = [
        Tick(lines=[joined(0)]),
        Tick(workers=[(stopped, WorkerStopped(rank=0, signal="SIGTERM", forced=False, waited_s=0.1))]),
        Tick(lines=[failed(5000, local_rank=0, code=-15), failed(5001, local_rank=1, code=3)], exit=1),
    ]
    n.supervisor.scripts = [Script(ticks)]
    outcome = n.run()
    assert (
        "Root cause (first failure): local rank 1 on pod trainer-0 (node 0), exit code 3 (pid 5001)"
        in outcome.cause
    )
    # The stop request is no failure: a worker_ended of its own, and worker_failed for the fault.
    assert [(f.worker_pid, f.reason) for f in n.logged(WorkerEnded)] == [(5000, "stopped")]
    assert [f.worker_pid for f in n.logged(WorkerFailed)] == [5001]
    assert "1 worker failure(s) in all, 1 more ended when told to stop" in outcome.cause


def traceback(rank: int, error: str) -> list[str]:
    """The lines torch.distributed's excepthook prints for an uncaught exception of ``rank``."""
    return [
        f"[rank{rank}]: Traceback (most recent call last):",
        f'[rank{rank}]:   File "/job/train.py", line 8, in <module>',
        f"[rank{rank}]:     step(model)",
        f"[rank{rank}]: {error}",
    ]


PEER_DIED = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:44249. This is typically caused by a remote worker crashing."
)


def test_the_rank_that_raised_first_is_the_root_cause_not_the_one_ft_launcher_named(tmp_path: Path) -> None:
    # Rank 1 raises; rank 0's collective breaks and it exits at once; ft_launcher finds both dead
    # in one look and names the lowest local rank, 0.
    ticks = [
        Tick(lines=[joined(0)]),
        Tick(lines=[*traceback(1, "RuntimeError: boom at step 3"), *traceback(0, PEER_DIED)]),
        Tick(lines=[failed(5000, local_rank=0, code=1)], exit=1),
    ]
    n = node(tmp_path, [Script(ticks)], max_restarts=0)
    outcome = n.run()
    assert (
        "Root cause (first failure): local rank 1 on pod trainer-0 (node 0), raised RuntimeError: "
        "boom at step 3; 2 worker failure(s) in all" in outcome.cause
    ), outcome.cause
    logged = [(f.rank, f.local_rank, f.worker_pid, f.exit_code, f.raised) for f in n.logged(WorkerFailed)]
    assert logged == [(1, 1, None, None, "RuntimeError: boom at step 3"), (0, 0, 5000, 1, PEER_DIED)]


@pytest.mark.parametrize(
    ("raised", "code"),
    [
        ([*traceback(0, PEER_DIED)], 3),  # only a broken connection was raised: no fault of its own
        ([*traceback(0, "ValueError: bad batch")], -9),  # the one ft_launcher named was killed
        ([*traceback(1, "ValueError: bad batch")], 3),  # the one that raised is the one named
    ],
)
def test_ft_launchers_pick_stays_the_root_cause(tmp_path: Path, raised: list[str], code: int) -> None:
    ticks = [Tick(lines=[joined(0), *raised]), Tick(lines=[failed(5001, local_rank=1, code=code)], exit=1)]
    n = node(tmp_path, [Script(ticks)], max_restarts=0)
    outcome = n.run()
    assert "Root cause (first failure): local rank 1 on pod trainer-0 (node 0), " in outcome.cause
    assert [f.local_rank for f in n.logged(WorkerFailed)] == [1]


def test_a_traceback_of_an_earlier_attempt_does_not_count(tmp_path: Path) -> None:
    ticks = [
        Tick(lines=[joined(0), *traceback(0, "ValueError: bad batch")]),
        Tick(lines=[failed(5000, local_rank=0, code=1), unhealthy(1, 1)]),
        Tick(lines=[joined(1)]),
        Tick(lines=[failed(5011, local_rank=1, code=2)], exit=1),
    ]
    n = node(tmp_path, [Script(ticks)], max_restarts=1, escalate_after=5)
    n.run()
    assert [(f.local_rank, f.raised) for f in n.logged(WorkerFailed)] == [
        (0, "ValueError: bad batch"),
        (1, None),
    ]


def test_a_worker_whose_in_process_restart_gave_up_says_why(tmp_path: Path) -> None:
    n = node(tmp_path, [], max_restarts=0)
    worker = n.worker(5001)
    reason = "in-process attempts ran out (3 of 3)"
    ticks = [
        Tick(workers=[(worker, WorkerGaveUp(rank=1, reason=reason))], lines=[failed(5001, code=1)], exit=1)
    ]
    n.supervisor.scripts = [Script(ticks)]
    outcome = n.run()
    assert f"exit code 1 after its in-process restart gave up ({reason}) (pid 5001)" in outcome.cause
    assert n.logged(WorkerFailed)[0].gave_up == reason


def test_restarts_are_the_round_the_workers_report(tmp_path: Path) -> None:
    # No line of ft_launcher's says it restarted (as with a version whose wording is not known):
    # the workers' TORCHELASTIC_RESTART_COUNT still tells how many restarts were used.
    n = node(tmp_path, [], escalate_after=5)
    ticks = []
    for attempt in range(3):
        worker = n.worker(5000 + attempt)
        ticks += [
            Tick(workers=[(worker, WorkerStart(rank=1, restart_count=attempt))]),
            Tick(lines=[failed(5000 + attempt)], exit=1 if attempt == 2 else None),
        ]
    n.supervisor.scripts = [Script(ticks)]
    outcome = n.run()
    assert "workers failed; 2/5 in-job restarts used" in outcome.cause


def test_what_an_earlier_life_of_the_pod_logged_is_not_read(tmp_path: Path) -> None:
    # The same run and node: the pod was replaced. Its workers' pids are reused by now.
    events = pod_events_file(tmp_path / "ckpt" / RUN_ID, 0)  # this pod's log
    old = EventLog(events, run_id=RUN_ID, source="worker", pid=5001)
    old.emit(WorkerStart(rank=1, restart_count=4))
    old.emit(WorkerStopped(rank=1, signal="SIGTERM"))
    n = node(tmp_path, [Script([Tick(lines=[failed(5001)], exit=1)])], max_restarts=0)
    outcome = n.run()
    assert "0/0 in-job restarts used" in outcome.cause and "(pid 5001)" in outcome.cause
    assert n.logged(WorkerFailed)[-1].worker_pid == 5001 and n.logged(WorkerEnded) == []


def test_a_failed_run_names_the_volume_problem_in_its_cause(tmp_path: Path) -> None:
    n = node(tmp_path, [], max_restarts=0)
    worker = n.worker(5001)
    full = CheckpointFailed(rank=0, step=40, error="No space left on device (ENOSPC)", failed_in_a_row=3)
    n.supervisor.scripts = [Script([Tick(workers=[(worker, full)], lines=[failed(5001)], exit=1)])]
    outcome = n.run()
    assert outcome.exit_code == 1
    volume = tmp_path / "ckpt"
    assert outcome.cause.endswith(
        f'. Checkpoint volume ([checkpoint] dir = "{volume}"): the checkpoint of step 40 was not saved: '
        "No space left on device (ENOSPC) (3 failed save(s) in a row)"
    ), outcome.cause
    assert "\n" not in outcome.cause


def test_a_volume_problem_that_went_away_is_not_named(tmp_path: Path) -> None:
    n = node(tmp_path, [], max_restarts=0)
    worker = n.worker(5001)
    full = CheckpointFailed(rank=0, step=40, error="No space left on device (ENOSPC)", failed_in_a_row=1)
    ticks = [Tick(workers=[(worker, full)]), Tick(workers=[(worker, CheckpointCommitted(rank=0, step=50))])]
    n.supervisor.scripts = [Script([*ticks, Tick(lines=[failed(5001)], exit=1)])]
    outcome = n.run()
    assert outcome.exit_code == 1 and "Checkpoint volume" not in outcome.cause


def test_worker_events_are_shown_as_they_happen(tmp_path: Path) -> None:
    n = node(tmp_path, [], max_restarts=0)
    worker = n.worker(5001)
    fault = FaultInjected(rank=1, step=50, kind="exception")
    restart = RestartBegin(rank=1, layer="in_process", iteration=1, cause="exception")
    n.supervisor.scripts = [
        Script(
            [
                Tick(workers=[(worker, fault), (worker, Step(rank=1, step=50))]),
                Tick(workers=[(worker, restart)], exit=0),
            ]
        )
    ]
    assert n.run().exit_code == 0
    shown = [e for e in n.shown if e.source == "worker"]
    assert [(type(e), e.rank) for e in shown] == [(FaultInjected, 1), (RestartBegin, 1)]
    assert not [
        e for e in n.logged(Event) if e.source == "launcher" and e.name in ("fault_injected", "restart_begin")
    ]


def test_the_cause_goes_to_the_termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "termination-log"
    monkeypatch.setenv("NVTRAIN_TERMINATION_LOG", str(path))
    n = node(tmp_path, [Script([Tick(lines=[failed(5001)], exit=1)])], max_restarts=0)
    outcome = n.run()
    assert path.read_text(encoding="utf-8") == outcome.cause + "\n"


def test_a_termination_log_that_cannot_be_written_is_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "no-such-folder" / "termination-log"
    monkeypatch.setenv("NVTRAIN_TERMINATION_LOG", str(path))
    n = node(tmp_path, [Script([Tick(exit=0)])])
    assert n.run().exit_code == 0
    [shown] = [e for e in n.shown if isinstance(e, TerminationLogError)]
    assert shown.path == str(path) and shown.variable == "NVTRAIN_TERMINATION_LOG"
    assert not [e for e in n.logged(Event) if e.name == "termination_log_error"]  # shown only


# -- decisions from the workers' own events -------------------------------------------------------


def test_a_failure_is_named_by_the_global_rank_its_worker_logged(tmp_path: Path) -> None:
    """ft_launcher names a local rank only; the worker's worker_start (pid, rank) gives the
    global one, and NVRx 0.4's hang line, which names the global rank, is matched by it."""
    n = node(tmp_path, [], rank=1, nodes=2, max_restarts=0, escalate_after=5)
    worker = n.worker(5001, node=1)
    ticks = [
        Tick(lines=[joined(0, nodes=2)], workers=[(worker, WorkerStart(rank=3, restart_count=0))]),
        Tick(lines=[hang(3)]),  # NVRx 0.4.1: "RankMonServer<pid>@host:<global rank>"
        Tick(lines=[failed(5001, local_rank=1, code=-9)], exit=1),
    ]
    n.supervisor.scripts = [Script(ticks)]
    outcome = n.run()
    (failure,) = n.logged(WorkerFailed)
    assert (failure.rank, failure.local_rank, failure.hang) == (3, 1, True)
    assert (
        "local rank 1 (global rank 3) on pod trainer-1 (node 1), killed by SIGKILL after its heartbeats"
        in (outcome.cause)
    )


def test_no_relaunch_when_the_workers_used_every_restart_before_the_launcher_error(tmp_path: Path) -> None:
    """NVRx 0.6.0 ends a spent budget with an error of its own ("e=AssertionError()", seen in
    tests/launcher/nvrx_logs/0.6.0/restarts_exhausted.log): that is the job failing, not ft_launcher,
    so a node that does not host the store must not start it again."""
    spent = (
        "2026-12-02 09:07:41,004 [ERROR] [trainer-1] [workload:?(?) infra:?(?)] launcher.py:1 Agent run "
        "ended with exception, e=AssertionError(). Agent's exit code = 1"
    )
    n = node(tmp_path, [], rank=1, nodes=2, max_restarts=1, escalate_after=5)
    worker = n.worker(5001, node=1)
    worker2 = n.worker(5002, node=1)
    ticks = [
        Tick(lines=[joined(0, nodes=2)], workers=[(worker, WorkerStart(rank=1, restart_count=0))]),
        Tick(lines=[failed(5001, local_rank=0), unhealthy(1, 1)]),
        Tick(lines=[joined(1, nodes=2)], workers=[(worker2, WorkerStart(rank=1, restart_count=1))]),
        Tick(lines=[failed(5002, local_rank=0), spent], exit=1),
    ]
    n.supervisor.scripts = [Script(ticks), Script([Tick(exit=0)])]
    outcome = n.run()
    assert outcome.exit_code == ExitCode.FAILED
    assert len(n.supervisor.started) == 1 and n.logged(Relaunch) == []

"""Supervise one node: wait for DNS, start ft_launcher, pass signals on, escalate, report.

The loop reads top to bottom: plan -> wait for pod 0's name -> start ft_launcher in a session of
its own -> echo and watch its log -> on a signal, forward SIGTERM and allow ``stop_timeout`` ->
on exit, kill every leftover descendant and say why the run ended. A node that does not host the
rendezvous store starts ft_launcher again (re-resolving pod 0's name) when its launcher ends with
an error rather than a spent budget: that is how the job outlives a replaced pod 0. A rendezvous
that did not gather its nodes within ``join_timeout`` is not retried here: it ends with exit 3.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from nvtrain.config.schema import Policy
from nvtrain.errors import NvtrainError, UsageError
from nvtrain.events import EventLog, EventTail
from nvtrain.launcher.dns import wait_until_resolvable
from nvtrain.launcher.identity import Identity
from nvtrain.launcher.logwatch import RENDEZVOUS_TIMEOUT, parse_line
from nvtrain.launcher.outcome import Outcome, decide, seconds, write_termination_log
from nvtrain.launcher.plan import LaunchPlan, build_plan
from nvtrain.launcher.process import Child, become_subreaper, kill_all
from nvtrain.nvrx import NvrxVersion, installed_nvrx

if TYPE_CHECKING:
    from nvtrain.report.live import MetricsServer

__all__ = ["Outcome", "Reporter", "RunPaths", "prepare", "supervise", "write_state"]

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_SHOWN = {
    "fault_injected",
    "restart_begin",
    "restart_end",
    "checkpoint_restored",
    "checkpoint_settled",
    "checkpoint_corrupt",
    "checkpoint_partial",
    "checkpoint_failed",
}
_SHOWN_FIELDS = (
    "rank", "step", "kind", "layer", "iteration", "origin", "seconds", "finished", "problem", "error",
)  # fmt: skip
_MAX_TMPDIR = 60
_PROBE_BYTES = 64 << 10
"""Written (and synced) into the run's folder at start: a full volume fails here, not later."""
_STOP_GRACE = 5.0
"""Seconds ft_launcher gets beyond ``stop_timeout`` to exit once told to stop."""

Reporter = Callable[[str, dict[str, Any]], None]
"""Called with (event, fields) for everything the supervisor records; the CLI renders it."""


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """Files of one run on this node."""

    run_dir: Path
    """``<checkpoint dir>/<run id>``: shared by every pod (events log, checkpoints)."""
    events: Path
    state_dir: Path
    """Node-local: the resolved policy handed to the workers."""
    policy: Path


def prepare(
    policy: Policy,
    identity: Identity,
    *,
    extra_args: tuple[str, ...] = (),
    nvrx: NvrxVersion | None = None,
    python: str = sys.executable,
) -> tuple[LaunchPlan, RunPaths]:
    """The plan and the paths of this run; writes nothing (``--dry-run`` prints the plan)."""
    version = nvrx or installed_nvrx()
    if version is None:
        raise UsageError(
            "NVRx (nvidia-resiliency-ext) is not installed in this environment",
            "install it in the training image: pip install 'nvtrain[worker]'",
        )
    run_dir = Path(policy.checkpoint.dir) / identity.run_id
    # One folder per launcher process: a second launcher of the same run and node on this
    # machine (a test, a stray local start) must not overwrite or delete this one's policy.
    state = Path(tempfile.gettempdir()) / f"nvtrain-{identity.run_id}-node{identity.node_rank}-{os.getpid()}"
    paths = RunPaths(run_dir, run_dir / "events.jsonl", state, state / "policy.json")
    plan = build_plan(
        policy,
        identity,
        version,
        python=python,
        policy_path=str(paths.policy),
        events_path=str(paths.events),
        extra_args=extra_args,
    )
    return plan, paths


def write_state(policy: Policy, paths: RunPaths) -> None:
    """Write the resolved policy (JSON) that the workers read through ``NVTRAIN_POLICY``,
    after checking that the run's folder can be written, with room to spare (so a refused start
    leaves nothing). A storage error is a ``UsageError`` (exit 2) naming the key and the fix."""
    created = not paths.run_dir.exists()
    try:
        paths.run_dir.mkdir(parents=True, exist_ok=True)
        _probe(paths.run_dir)
    except OSError as exc:
        if created:
            with contextlib.suppress(OSError):
                paths.run_dir.rmdir()
        raise unwritable_run_dir(policy, paths.run_dir, exc) from None
    try:
        paths.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = paths.policy.with_suffix(".tmp")
        tmp.write_text(policy.model_dump_json(by_alias=True), encoding="utf-8")
        os.replace(tmp, paths.policy)
    except OSError as exc:
        shutil.rmtree(paths.state_dir, ignore_errors=True)
        raise UsageError(
            f"cannot write the run's state folder {paths.state_dir} in $TMPDIR: {os_error_text(exc)}",
            "free space in $TMPDIR, or point TMPDIR at a writable folder with room",
        ) from None


def _probe(folder: Path) -> None:
    """Write ``_PROBE_BYTES`` into ``folder`` and sync them, then remove the file. The name is
    unique: pods share the folder, and a pod's pid may well be another pod's."""
    probe = folder / f".write-test-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            data = memoryview(bytes(_PROBE_BYTES))
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def os_error_text(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the errno's text and name."""
    code = errno.errorcode.get(exc.errno or 0, "")
    return (exc.strerror or str(exc)) + (f" ({code})" if code else "")


_STORAGE_FIXES = {
    errno.ENOSPC: "free space on that volume (old runs' checkpoints) or give it more, or point "
    "[checkpoint] dir at a volume with room",
    errno.EDQUOT: "raise the volume's quota or free space in it, or point [checkpoint] dir at a "
    "volume with room",
    errno.EROFS: "mount the checkpoint volume read-write (readOnly: false in the pod's volumeMounts), "
    "or point [checkpoint] dir at writable storage",
    errno.EACCES: "let the pod's user write there (e.g. the pod's securityContext fsGroup), or point "
    "[checkpoint] dir at storage this pod can write",
}
_STORAGE_FIXES[errno.EPERM] = _STORAGE_FIXES[errno.EACCES]
_ANY_STORAGE_FIX = "point [checkpoint] dir at storage this pod can write (the shared checkpoint volume)"


def unwritable_run_dir(policy: Policy, run_dir: Path, exc: OSError) -> UsageError:
    """The run's folder cannot be written at start: a usage error (exit 2) with the fix."""
    return UsageError(
        f"[checkpoint] dir = {json.dumps(policy.checkpoint.dir)}: cannot write the run's "
        f"folder {run_dir}: {os_error_text(exc)}",
        _STORAGE_FIXES.get(exc.errno or 0, _ANY_STORAGE_FIX),
    )


class _Watch:
    """What ft_launcher's log, the workers' events and the signals told us so far."""

    def __init__(
        self,
        policy: Policy,
        events: EventLog,
        report: Reporter,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.events = events
        self.report = report
        self.clock = clock
        self.tail = EventTail(events.path)
        self.failures: list[dict[str, Any]] = []
        self.restarts = 0
        self.launcher_error: str | None = None
        self.rendezvous_timeout = False
        self.world_nodes: int | None = None
        """Nodes in the last completed rendezvous round, if one completed."""
        self.attempt_started = clock()
        """When the current attempt's workers started (its rendezvous completed)."""
        self.last_step: int | None = None
        self.step_at_failure: int | None = None
        self.stalled = 0
        self.escalated: str | None = None
        """Why nvtrain stopped the run as a loop without progress (exit 4), once it did."""
        self.hangs: set[int] = set()
        self.same_rank = 0
        self.signum: int | None = None
        self.storage: dict[str, str] = {}
        """Storage problems still current, by source (checkpoint saves, the events log)."""
        self.lock = threading.Lock()

    def stopped(self) -> bool:
        """A forwarded signal arrived (set from the signal handler at any time)."""
        return self.signum is not None

    def emit(self, event: str, **fields: Any) -> None:
        self.events.emit(event, **fields)
        self.report(event, fields)

    def events_log_report(self, event: str, fields: dict[str, Any]) -> None:
        """The events log's own report (a write that failed, or works again): noted, shown."""
        if event == "events_log_error":
            self.storage["events"] = f"the events log {fields['path']} cannot be written: {fields['error']}"
        elif event == "events_log_resumed":
            self.storage.pop("events", None)
        self.report(event, fields)

    def storage_problem(self) -> str | None:
        """The storage problems still current, in one line (None when there are none)."""
        return "; ".join(self.storage.values()) or None

    def _note_storage(self, record: dict[str, Any]) -> None:
        if record.get("event") == "checkpoint_failed":
            self.storage["checkpoint"] = (
                f"the checkpoint of step {record.get('step')} was not saved: {record.get('error')} "
                f"({record.get('failed_in_a_row', 1)} failed save(s) in a row)"
            )
        elif record.get("event") in ("checkpoint_committed", "checkpoint_already_committed"):
            self.storage.pop("checkpoint", None)

    def _progress(self) -> int | None:
        for record in self.tail.poll():
            self._note_storage(record)
            if record.get("event") == "step" and isinstance(record.get("step"), int):
                self.last_step = max(self.last_step or 0, record["step"])
            if record.get("source") != "launcher" and record.get("event") in _SHOWN:
                fields = {k: v for k, v in record.items() if k in _SHOWN_FIELDS}
                self.report(str(record["event"]), fields)  # shown, not logged again
        return self.last_step

    def poll_workers(self) -> None:
        """Show what the workers logged (faults, in-process restarts, restores) as it happens."""
        with self.lock:
            self._progress()

    def launcher_started(self) -> None:
        """A new ft_launcher starts: its first attempt counts from now until its rendezvous."""
        with self.lock:
            self.attempt_started = self.clock()
            self.launcher_error = None
            self.rendezvous_timeout = False

    def line(self, text: str) -> None:
        parsed = parse_line(text)
        if parsed is None:
            return
        event, fields = parsed
        with self.lock:
            if event == "rendezvous_done":
                self.attempt_started = self.clock()  # the workers start right after it
                self.world_nodes = fields["nodes"]
            elif event == "worker_failed":
                if any(f["worker_pid"] == fields["worker_pid"] for f in self.failures):
                    return
                self.failures.append(fields)
                self._check_progress(fields)
            elif event == "restart_begin":
                self.restarts += 1
            elif event == "hang_detected":
                self.hangs.add(fields["local_rank"])
            elif event == "launcher_error":
                self.launcher_error = fields["message"]
                self.rendezvous_timeout = fields["error"] == RENDEZVOUS_TIMEOUT
            self.emit(event, **fields)

    def _check_progress(self, failure: dict[str, Any]) -> None:
        """Escalate when failures repeat without progress: at the same step when the workers
        report steps (the worker library does), else when the same local rank fails again in
        attempts that each ended within ``[heartbeat] initial_timeout`` of their start. An
        attempt that ran longer got past start-up, which counts as progress: the count of
        failures in a row starts again."""
        if failure["local_rank"] in self.hangs:
            failure["hang"] = True
        step = self._progress()
        if step is None:
            previous = self.failures[-2] if len(self.failures) > 1 else None
            same = previous is not None and previous["local_rank"] == failure["local_rank"]
            ran = self.clock() - self.attempt_started
            progressed = ran >= self.policy.heartbeat.initial_timeout
            self.same_rank = self.same_rank + 1 if same and not progressed else 1
            if self.same_rank >= self.policy.restart.escalate_after:
                self.escalated = (
                    f"local rank {failure['local_rank']} failed {self.same_rank} times in a row, "
                    "each time within [heartbeat] initial_timeout = "
                    f"{seconds(self.policy.heartbeat.initial_timeout)} of its attempt's start "
                    "(the workers report no steps; an attempt that runs longer counts as progress)"
                )
            return
        self.stalled = self.stalled + 1 if step == self.step_at_failure else 1
        self.step_at_failure = step
        failure["step"] = step
        if self.stalled >= self.policy.restart.escalate_after:
            self.escalated = (
                f"{self.stalled} failures in a row at step {step} (last: local rank {failure['local_rank']})"
            )


class _Stopped(Exception):
    """A forwarded signal arrived while no launcher was running (e.g. during the DNS wait)."""


def supervise(
    plan: LaunchPlan,
    policy: Policy,
    identity: Identity,
    paths: RunPaths,
    *,
    out: TextIO | None = None,
    report: Reporter | None = None,
) -> Outcome:
    """Run ``plan`` on this node until it ends; returns the exit code and its cause.

    A ``DnsTimeout`` (exit 3) is recorded in the events log and the termination log, then
    raised for the caller to report.
    """
    out = out or sys.stdout
    nvrx = installed_nvrx()
    write_state(policy, paths)
    try:
        metrics = _serve_metrics(policy, identity, paths)
        try:  # makes the run's folder, written a moment ago: fails only if it fails now
            events = EventLog(
                paths.events, node=identity.node_rank, run_id=identity.run_id, source="launcher"
            )
        except OSError as exc:
            if metrics:
                metrics.close()
            raise unwritable_run_dir(policy, paths.run_dir, exc) from None
    except BaseException:
        shutil.rmtree(paths.state_dir, ignore_errors=True)
        raise
    report = report or (lambda event, fields: None)
    watch = _Watch(policy, events, report)
    # A failed write (full checkpoint volume) is reported, never raised; and noted for the cause.
    events.report = watch.events_log_report
    shown = {"metrics_port": metrics.port} if metrics else {}
    watch.emit("launcher_start", argv=plan.argv, endpoint=plan.endpoint, is_host=plan.is_host, **shown)
    become_subreaper()
    env = {**plan.env_defaults, **os.environ, **plan.env}
    if len(tempfile.gettempdir()) > _MAX_TMPDIR:
        # NVRx puts its Unix sockets in $TMPDIR; a long path breaks them silently (108 bytes).
        env["TMPDIR"] = "/tmp"
    child: list[Child] = []  # the launcher running now, if any
    waiting = [False]  # True while waiting for DNS: a signal then ends the wait at once

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if watch.signum is None:
            watch.signum = signum
            watch.emit("signal", signal=signal.Signals(signum).name)
        if child:
            child[0].send(signal.SIGTERM)
        elif waiting[0]:
            raise _Stopped()

    previous = {s: signal.signal(s, on_signal) for s in _FORWARDED}
    try:
        code = _loop(plan, policy, watch, env, child, waiting, out, nvrx)
    except _Stopped:
        code = -1
    except NvtrainError as exc:
        watch.emit("launcher_exit", exit_code=int(exc.exit_code), cause=str(exc))
        write_termination_log(str(exc), watch.report)
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        shutil.rmtree(paths.state_dir, ignore_errors=True)
        if metrics:
            metrics.close()
    outcome = decide(code, watch, policy, identity, plan.endpoint, nvrx, storage=watch.storage_problem())
    watch.emit("launcher_exit", exit_code=outcome.exit_code, cause=outcome.cause)
    write_termination_log(outcome.cause, watch.report)
    return outcome


def _serve_metrics(policy: Policy, identity: Identity, paths: RunPaths) -> MetricsServer | None:
    """Start the Prometheus endpoint when the policy asks for it; a port that cannot be bound
    is a usage error (exit 2) naming the key, before any worker starts."""
    if not policy.metrics.enabled:
        return None
    from nvtrain.report.live import bind_address, serve

    try:
        return serve(
            policy.metrics,
            paths.events,
            run_id=identity.run_id,
            node=identity.node_rank,
            address=bind_address(os.environ.get("POD_IP")),
        )
    except OSError as exc:
        raise UsageError(
            f"[metrics] port = {policy.metrics.port}: cannot serve metrics on it ({exc.strerror or exc})",
            "choose a free port in [metrics] port, or set [metrics] enabled = false",
        ) from None


def _loop(
    plan: LaunchPlan,
    policy: Policy,
    watch: _Watch,
    env: dict[str, str],
    child: list[Child],
    waiting: list[bool],
    out: TextIO,
    nvrx: NvrxVersion | None,
) -> int:
    relaunches = 0
    while True:
        if watch.stopped():
            return -1
        if plan.wait_for:
            waiting[0] = True
            addresses = wait_until_resolvable(
                plan.wait_for,
                policy.rendezvous.dns_timeout,
                on_retry=lambda waited, err: watch.report(
                    "dns_wait", {"name": plan.wait_for, "error": err, "waited": round(waited)}
                ),
            )
            waiting[0] = False
            watch.emit("dns_resolved", name=plan.wait_for, addresses=addresses)
        code = _run_once(plan, watch, env, child, out)
        if watch.stopped() or watch.escalated or code == 0:
            return code
        if plan.is_host or watch.launcher_error is None or watch.rendezvous_timeout:
            return code
        if nvrx is not None and nvrx.is_no_restart_exit(code):
            return code
        if relaunches >= policy.restart.in_job.max_restarts:
            return code
        relaunches += 1
        watch.emit("relaunch", layer="launcher", reason=watch.launcher_error, attempt=relaunches)


def _run_once(plan: LaunchPlan, watch: _Watch, env: dict[str, str], child: list[Child], out: TextIO) -> int:
    watch.launcher_started()
    # The guard stops ft_launcher's tree should this process die without doing it (SIGKILL).
    launcher = Child(plan.argv, env, capture=True, guard=plan.stop_timeout + _STOP_GRACE)
    child[:] = [launcher]
    watch.emit("launcher_started", launcher_pid=launcher.pid)
    if watch.signum is not None:  # a signal arrived between the DNS wait and the start
        launcher.send(signal.SIGTERM)
    reader = threading.Thread(target=_pump, args=(launcher, watch, out), daemon=True)
    reader.start()
    try:
        code = _wait(launcher, watch, plan)
    finally:
        child.clear()
        leftovers = kill_all(timeout=2.0)
        reader.join(timeout=5.0)
    if leftovers:
        watch.emit("killed_leftovers", pids=leftovers)
    return code


def _pump(child: Child, watch: _Watch, out: TextIO) -> None:
    """Echo ft_launcher's output and watch it until the pipe closes. Nothing may end this loop
    early: ft_launcher (and every worker writing to the same pipe) blocks once the unread pipe
    is full, and the job would hang. A failure is reported once per kind and the loop goes on."""
    stream = child.popen.stdout
    assert stream is not None
    failed: set[str] = set()
    for text in stream:
        try:
            out.write(text)
            out.flush()
        except Exception as exc:  # any: see above
            _failed_once(watch, failed, "echo", exc)
        try:
            watch.line(text)
        except Exception as exc:  # any: see above
            _failed_once(watch, failed, "watch", exc)


def _failed_once(watch: _Watch, failed: set[str], what: str, exc: Exception) -> None:
    if what in failed:
        return
    failed.add(what)
    doing = "echoing" if what == "echo" else "reading events from"
    with contextlib.suppress(Exception):  # the report goes to stderr, which may be what fails
        watch.report(
            "launcher_output_error",
            {"error": f"{doing} ft_launcher's output: {type(exc).__name__}: {exc} (reported once; goes on)"},
        )


def _wait(child: Child, watch: _Watch, plan: LaunchPlan) -> int:
    deadline: float | None = None
    while True:
        code = child.wait(timeout=0.2)
        watch.poll_workers()
        if code is not None:
            return code
        if watch.escalated:
            child.send(signal.SIGTERM)
            return child.stop(time.monotonic() + plan.stop_timeout)
        if watch.signum is not None:
            if deadline is None:
                deadline = time.monotonic() + plan.stop_timeout + _STOP_GRACE
            elif time.monotonic() >= deadline:
                return child.stop(time.monotonic())

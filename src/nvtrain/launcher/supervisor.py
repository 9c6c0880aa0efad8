"""Supervise one node: wait for DNS, start ft_launcher, pass signals on, escalate, report.

The loop reads top to bottom: plan -> wait for pod 0's name -> start ft_launcher in a session of
its own -> echo and watch its log -> on a signal, forward SIGTERM and allow ``stop_timeout`` ->
on exit, kill every leftover descendant and say why the run ended.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode, UsageError, signal_exit_code
from nvtrain.launcher.dns import wait_until_resolvable
from nvtrain.launcher.events import EventLog
from nvtrain.launcher.identity import Identity
from nvtrain.launcher.logwatch import parse_line
from nvtrain.launcher.plan import LaunchPlan, build_plan
from nvtrain.launcher.process import Child, become_subreaper, kill_all
from nvtrain.nvrx import NvrxVersion, installed_nvrx

__all__ = ["Outcome", "prepare", "supervise"]

TERMINATION_LOG = Path("/dev/termination-log")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How the run ended on this node."""

    exit_code: int
    cause: str


def prepare(
    policy: Policy,
    identity: Identity,
    *,
    extra_args: tuple[str, ...] = (),
    nvrx: NvrxVersion | None = None,
    state_dir: Path | None = None,
) -> tuple[LaunchPlan, Path, Path]:
    """Write the resolved policy for the workers and build the plan.

    Returns (plan, resolved policy path, events path). Pure apart from the policy file.
    """
    version = nvrx or installed_nvrx()
    if version is None:
        raise UsageError(
            "NVRx (nvidia-resiliency-ext) is not installed in this environment",
            "pip install 'nvtrain[worker]' (or nvidia-resiliency-ext) in the image",
        )
    run_dir = Path(policy.checkpoint.dir) / identity.run_id
    events_path = run_dir / "events.jsonl"
    state = state_dir or Path(tempfile.gettempdir()) / f"nvtrain-{identity.run_id}"
    state.mkdir(parents=True, exist_ok=True)
    policy_path = state / "policy.json"
    policy_path.write_text(policy.model_dump_json(by_alias=True), encoding="utf-8")
    plan = build_plan(
        policy,
        identity,
        version,
        python=sys.executable,
        policy_path=str(policy_path),
        events_path=str(events_path),
        extra_args=extra_args,
    )
    return plan, policy_path, events_path


class _Watch:
    """What the log and the signals told us so far."""

    def __init__(self, policy: Policy, events: EventLog) -> None:
        self.policy = policy
        self.events = events
        self.failures: list[dict[str, Any]] = []
        self.same_rank_in_a_row = 0
        self.escalated: str | None = None
        self.signum: int | None = None
        self.lock = threading.Lock()

    def line(self, text: str) -> None:
        parsed = parse_line(text)
        if parsed is None:
            return
        event, fields = parsed
        with self.lock:
            if event == "worker_failed":
                if any(f["worker_pid"] == fields["worker_pid"] for f in self.failures):
                    return
                last = self.failures[-1] if self.failures else None
                same = last is not None and last["local_rank"] == fields["local_rank"]
                self.same_rank_in_a_row = self.same_rank_in_a_row + 1 if same else 1
                self.failures.append(fields)
                if self.same_rank_in_a_row >= self.policy.restart.escalate_after:
                    self.escalated = (
                        f"local rank {fields['local_rank']} failed {self.same_rank_in_a_row} times in a row"
                    )
            self.events.emit(event, **fields)


def supervise(
    plan: LaunchPlan,
    policy: Policy,
    identity: Identity,
    events_path: Path,
    *,
    out: TextIO | None = None,
    log: Callable[[str], None] | None = None,
) -> Outcome:
    """Run ``plan`` on this node until it ends; returns the exit code and its cause."""
    out = out or sys.stdout
    say = log or (lambda text: print(f"nvtrain: {text}", file=sys.stderr, flush=True))
    events = EventLog(events_path, node=identity.node_rank, run_id=identity.run_id, source="launcher")
    events.emit("launcher_start", argv=plan.argv, endpoint=plan.endpoint, is_host=plan.is_host)
    if plan.wait_for:
        say(f"waiting for {plan.wait_for} to resolve")
        addresses = wait_until_resolvable(
            plan.wait_for,
            policy.rendezvous.dns_timeout,
            on_retry=lambda waited, err: say(f"{plan.wait_for}: {err}; waited {waited:.0f}s"),
        )
        events.emit("dns_resolved", name=plan.wait_for, addresses=addresses)
    become_subreaper()
    watch = _Watch(policy, events)
    child = Child(plan.argv, {**os.environ, **plan.env}, capture=True)
    say(f"run {identity.run_id}: ft_launcher started (pid {child.pid}), node {identity.node_rank}")

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if watch.signum is None:
            watch.signum = signum
            events.emit("signal", signal=signal.Signals(signum).name)
            child.send(signal.SIGTERM)

    previous = {s: signal.signal(s, on_signal) for s in _FORWARDED}
    reader = threading.Thread(target=_pump, args=(child, watch, out), daemon=True)
    reader.start()
    try:
        code = _wait(child, watch, plan)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        leftovers = kill_all(timeout=2.0)
        reader.join(timeout=5.0)
    outcome = _outcome(code, watch, policy, identity)
    events.emit("launcher_exit", exit_code=outcome.exit_code, cause=outcome.cause, killed_leftovers=leftovers)
    say(outcome.cause)
    _write_termination_log(outcome.cause)
    return outcome


def _pump(child: Child, watch: _Watch, out: TextIO) -> None:
    stream = child.popen.stdout
    assert stream is not None
    for text in stream:
        out.write(text)
        out.flush()
        watch.line(text)


def _wait(child: Child, watch: _Watch, plan: LaunchPlan) -> int:
    deadline: float | None = None
    while True:
        code = child.wait(timeout=0.2)
        if code is not None:
            return code
        if watch.escalated and deadline is None:
            deadline = time.monotonic() + plan.stop_timeout
            return child.stop(deadline)
        if watch.signum is not None:
            if deadline is None:
                deadline = time.monotonic() + plan.stop_timeout + 5.0
            elif time.monotonic() >= deadline:
                return child.stop(time.monotonic())


def _outcome(code: int, watch: _Watch, policy: Policy, identity: Identity) -> Outcome:
    where = f"pod {identity.hostname} (node {identity.node_rank})"
    if watch.signum is not None:
        name = signal.Signals(watch.signum).name
        return Outcome(
            signal_exit_code(watch.signum), f"stopped by {name} on {where}; workers were asked to stop first"
        )
    if watch.escalated:
        return Outcome(
            int(ExitCode.ESCALATED),
            f"escalation on {where}: {watch.escalated} without progress "
            f"([restart] escalate_after = {policy.restart.escalate_after}); "
            "not retrying: fix the cause, then start a new run",
        )
    if code == 0:
        return Outcome(int(ExitCode.OK), f"run {identity.run_id} finished on {where}")
    budget = policy.restart.in_job.max_restarts
    if watch.failures:
        first = watch.failures[0]
        how = f"killed by {first['signal']}" if first["signal"] else f"exit code {first['exit_code']}"
        cause = (
            f"workers failed; in-job restart budget ({budget}) spent. Root cause (first "
            f"failure): local rank {first['local_rank']} on {where}, {how} (pid "
            f"{first['worker_pid']}); {len(watch.failures)} worker failure(s) in all"
        )
        if first["signal"] == "SIGKILL":
            cause += ". A SIGKILL often means the OOM killer: look for OOMKilled in `kubectl describe pod`"
    else:
        cause = f"ft_launcher exited with code {code} on {where}; see its log above"
    return Outcome(int(ExitCode.FAILED), cause)


def _write_termination_log(text: str) -> None:
    if TERMINATION_LOG.exists():
        try:
            TERMINATION_LOG.write_text(text + "\n", encoding="utf-8")
        except OSError:
            pass

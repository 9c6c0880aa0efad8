"""A clean run under NVRx's in-process restart ends without a helper thread's error: 2 ranks (gloo,
the demo) under ``nvtrain run`` and the real ft_launcher, no faults.

Each rank's NVRx monitor process (forked twice from the worker, in a session of its own) reads
the heartbeats from the store that rank 0's process hosts. When the run finished, the workers
asked their monitors to stop and exited at once: rank 0's store went while the monitors
still read it, and a clean run's events log ended with a ``worker_thread_error``
(``SiblingMonitor-R``, ``DistNetworkError('Broken pipe')``) whenever a monitor looked once more
before it stopped. That is a race of a fraction of a second; here the monitors are held back
(stopped) from the end of training until rank 0's worker exits, as a loaded machine may hold
them, which makes it lose every time. Now every rank waits for its monitor process to end, and
rank 0 for every rank, before the store goes (``worker/inprocess_end.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from support.proc_helpers import (
    NvtrainRunner,
    Running,
    make_policy,
    processes_with_token,
    read_events,
    write_policy,
)
from support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STEPS = 10
RUN_ID = "clean-end"
HOLD_S = 4.0
"""The longest the monitors are held back after training (the scenario: a loaded machine); the
hold ends sooner once rank 0's worker has exited, but not before ``MIN_HOLD_S``."""
MIN_HOLD_S = 1.5
"""Past NVRx's heartbeat interval here (1 s): by then each monitor thread's wait has run out, so
it reads the store as soon as it runs again."""


def _monitors(run: Running) -> list[psutil.Process]:
    """The run's NVRx monitor processes: the only ones in a session whose leader has gone (the
    first of NVRx's two forks made it, then exited)."""
    found = [p for p in processes_with_token(run.token) if p.pid != run.pid]
    pids = {p.pid for p in found}
    monitors = []
    for process in found:
        with contextlib.suppress(OSError):
            if os.getsid(process.pid) not in pids:
                monitors.append(process)
    return monitors


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal_all(processes: list[psutil.Process], signum: signal.Signals) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signum)


def test_a_clean_in_process_run_logs_no_worker_thread_error(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    _, tables = make_policy(
        tmp_path,
        module="nvtrain.demo",
        args=["--steps", str(STEPS), "--step-time", "0.1", "--log-every", "5"],
        nproc=2,
        max_restarts=0,
        heartbeat={"timeout": "20s"},  # past the in-process layer's timeouts, as the demo's
    )
    # collective_timeout below soft_timeout, as gloo under the in-process layer needs
    tables["job"].update({"max_steps": STEPS, "backend": "gloo", "collective_timeout": "5s"})
    tables["restart.in_process"] = {"enabled": True, "soft_timeout": "10s", "hard_timeout": "15s"}
    tables["checkpoint"].update({"interval": 5, "async": True, "keep": 2})
    run_dir = tmp_path / "ckpt" / RUN_ID
    run = nvtrain.start("--run-id", RUN_ID, str(write_policy(tmp_path, tables)))

    monitors = wait_until(
        lambda: (found := _monitors(run)) and len(found) == 2 and found,
        90,
        "both ranks' NVRx monitor processes",
        alive=lambda: run.proc.poll() is None,
        detail=run.describe,
    )
    # The last save's commit, straight from the workers' log (their stdout comes later, through
    # ft_launcher): the training function returns right after it.
    wait_until(
        lambda: any(
            e["event"] == "checkpoint_committed" and e["step"] == STEPS for e in read_events(run_dir)
        ),
        120,
        f"the commit of step {STEPS}",
        alive=lambda: run.proc.poll() is None,
        detail=run.describe,
    )
    _signal_all(monitors, signal.SIGSTOP)
    try:
        workers = wait_until(
            lambda: {e["rank"]: e["pid"] for e in read_events(run_dir) if e["event"] == "worker_start"},
            30,
            "the workers' worker_start events",
        )
        stopped = time.monotonic()
        # The scenario: the monitors stay held until rank 0's worker is gone (at least
        # MIN_HOLD_S, at most HOLD_S).
        while time.monotonic() < stopped + HOLD_S:
            if time.monotonic() >= stopped + MIN_HOLD_S and not _alive(int(workers[0])):
                break
            time.sleep(0.02)
    finally:
        _signal_all(monitors, signal.SIGCONT)

    assert run.wait(timeout=150) == 0, run.describe()
    wait_until(lambda: not _monitors(run), 30, "the monitors' end")  # they write to the log too
    events = read_events(run_dir)
    names = [e["event"] for e in events]
    assert names.count("attempt_start") == 2 and "restart_begin" not in names, names
    assert sorted(e["rank"] for e in events if e["event"] == "checkpoint_committed") == [0, 0], names
    errors = [e for e in events if e["event"] == "worker_thread_error"]
    assert errors == [], errors
    assert "Traceback" not in run.stderr, run.stderr[-3000:]

"""SIGTERM to ``nvtrain run`` (the pod deleted, the scheduler's stop) stops a real 2-rank job
under ft_launcher (NVRx 0.4.1 on CPU) with exit 143 and prints no traceback: a stop that nvtrain
asked for is no failure.

The job is the demo's (the worker library, NVRx's in-process restart): as ft_launcher stops, it
cancels its rank monitors' connection handlers, which still hold a connection (the in-process
wrapper's own process keeps the worker's socket open), and asyncio logs each cancelled one with
a traceback. Those go to the launcher log only (``logwatch.LogSorter``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from support.ports import free_port_pair
from support.proc_helpers import NvtrainRunner, processes_with_token, read_events, write_policy

pytestmark = pytest.mark.slow


def test_sigterm_stops_the_job_without_a_traceback(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    run_dir = tmp_path / "ckpt" / "sigterm-1"
    tables = {
        "job": {
            "name": "sigterm",
            "module": "nvtrain.demo",
            "args": ["--steps", "100000", "--log-every", "1", "--step-time", "0.05"],
            "nproc_per_node": 2,
            "backend": "gloo",
            "collective_timeout": "10s",
            "stop_timeout": "20s",
            "warm_start": True,  # both workers forked from one import of torch
        },
        "rendezvous": {"port": free_port_pair(), "join_timeout": "60s"},
        "heartbeat": {"initial_timeout": "60s", "timeout": "20s", "monitor_interval": "1s"},
        "restart.in_process": {"enabled": True},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "interval": 1000},
    }
    policy = write_policy(tmp_path, tables)
    run = nvtrain.start(str(policy), env={"NVTRAIN_RUN_ID": "sigterm-1"})
    # Both ranks are training: each logged a completed step.
    deadline = time.monotonic() + 120
    while {e.get("rank") for e in read_events(run_dir) if e["event"] == "step"} < {0, 1}:
        assert run.proc.poll() is None, run.describe()
        assert time.monotonic() < deadline, run.describe()
        time.sleep(0.1)
    os.kill(run.pid, signal.SIGTERM)
    code = run.wait(timeout=60)
    assert code == 143, run.describe()
    assert processes_with_token(run.token) == [], run.describe()
    assert "Traceback" not in run.stdout + run.stderr, run.describe()
    events = read_events(run_dir)
    assert [e["signal"] for e in events if e["event"] == "signal"] == ["SIGTERM"]
    assert events[-1]["event"] == "launcher_exit" and events[-1]["exit_code"] == 143
    # A stop asked for is no failure (issue 39): the workers logged worker_stopped, and the one
    # ft_launcher saw exit with 143 is a worker_ended, not a worker_failed.
    stopped = {e["pid"] for e in events if e["event"] == "worker_stopped"}
    ended = [e for e in events if e["event"] == "worker_ended"]
    assert [e for e in events if e["event"] == "worker_failed"] == [], events
    assert ended and all(e["reason"] == "stopped" and e["worker_pid"] in stopped for e in ended), events
    # What was not shown is kept: ft_launcher's own log has every line it wrote.
    assert "SignalException" in (run_dir / "launcher-node0.log").read_text(encoding="utf-8")

"""SIGTERM to ``nvtrain run`` of a warm job (its 2 workers forked from the warm-start server),
under the real ft_launcher (NVRx 0.4.1 on CPU): exit 143, no traceback, and no
``launcher_error``.

ft_launcher forwards the SIGTERM to its workers, which exit with 143 as told; it then re-raises
its ``SignalException`` (a worker "exited non-zero") and logs "Agent run ended with exception,
e=SignalException(...)". That line is ft_launcher ending on the stop nvtrain asked for: it stays
in the launcher's log, and is no ``launcher_error`` in the events log."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from support.ports import free_port_pair
from support.proc_helpers import NvtrainRunner, processes_with_token, read_events, write_policy
from support.waiting import wait_until

pytestmark = pytest.mark.slow


def test_sigterm_stops_a_warm_job_without_a_launcher_error(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    run_dir = tmp_path / "ckpt" / "sigterm-warm-1"
    tables = {
        "job": {
            "name": "sigterm-warm",
            "module": "nvtrain.demo",
            "args": ["--steps", "100000", "--log-every", "1", "--step-time", "0.05"],
            "nproc_per_node": 2,
            "backend": "gloo",
            "collective_timeout": "10s",
            "stop_timeout": "20s",
            "warm_start": True,
        },
        "rendezvous": {"port": free_port_pair(), "join_timeout": "60s"},
        "heartbeat": {"initial_timeout": "60s", "timeout": "20s", "monitor_interval": "1s"},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "interval": 1000},
    }
    policy = write_policy(tmp_path, tables)
    run = nvtrain.start(str(policy), env={"NVTRAIN_RUN_ID": "sigterm-warm-1"})
    # Both ranks are training: each logged a completed step.
    wait_until(
        lambda: {e.get("rank") for e in read_events(run_dir) if e["event"] == "step"} >= {0, 1},
        120,
        "a step logged by each rank",
        alive=lambda: run.proc.poll() is None,
        detail=run.describe,
    )
    events = read_events(run_dir)
    assert all(e.get("warm") for e in events if e["event"] == "worker_start"), events
    os.kill(run.pid, signal.SIGTERM)
    code = run.wait(timeout=60)
    assert code == 143, run.describe()
    assert processes_with_token(run.token) == [], run.describe()
    assert "Traceback" not in run.stdout + run.stderr, run.describe()
    events = read_events(run_dir)
    assert [e["signal"] for e in events if e["event"] == "signal"] == ["SIGTERM"]
    assert [e for e in events if e["event"] == "launcher_error"] == [], events
    assert "launcher_error" not in run.stderr, run.describe()
    assert events[-1]["event"] == "launcher_exit" and events[-1]["exit_code"] == 143
    assert "stopped by SIGTERM" in events[-1]["cause"], events[-1]
    # What ft_launcher said is kept in its own log (when it got that far before it ended).
    log = (run_dir / "launcher-node0.log").read_text(encoding="utf-8")
    assert "SignalException" in log, log[-2000:]

"""Ctrl-C (SIGINT) to ``nvtrain run`` reaches the workers as SIGINT, under the real ft_launcher
(NVRx 0.4.1 on CPU): a script's ``except KeyboardInterrupt:`` save runs, as under torchrun."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from support.proc_helpers import BIN, NvtrainRunner, make_policy, processes_with_token, read_events

pytestmark = pytest.mark.slow


def wait_for_files(paths: list[Path], run_alive: Callable[[], bool], timeout: float) -> None:
    """Until every one of ``paths`` exists; fails if the run ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert run_alive(), "nvtrain ended before the workers were ready"
        assert time.monotonic() < deadline, f"no {paths} within {timeout:.0f}s"
        time.sleep(0.1)


def test_sigint_reaches_the_workers_as_sigint(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    policy, _ = make_policy(
        tmp_path, script=str(BIN / "interrupt_worker.py"), args=[str(markers)], stop_timeout="20s"
    )
    run = nvtrain.start(str(policy), env={"NVTRAIN_RUN_ID": "sigint-1"})
    wait_for_files([markers / "ready-0", markers / "ready-1"], lambda: run.proc.poll() is None, 90)
    os.kill(run.pid, signal.SIGINT)
    code = run.wait(timeout=60)
    assert code == 130, run.describe()
    assert sorted(p.name for p in markers.glob("saved-*")) == ["saved-0", "saved-1"], run.describe()
    assert processes_with_token(run.token) == [], run.describe()
    events = read_events(tmp_path / "ckpt" / "sigint-1")
    assert [e["signal"] for e in events if e["event"] == "signal"] == ["SIGINT"]
    assert events[-1]["event"] == "launcher_exit" and events[-1]["exit_code"] == 130
    assert "stopped by SIGINT" in events[-1]["cause"]
    # The workers ended on request: no worker_failed (issue 39); any seen exiting is a worker_ended.
    assert [e for e in events if e["event"] == "worker_failed"] == [], events
    assert {e["reason"] for e in events if e["event"] == "worker_ended"} <= {"stopped"}, events

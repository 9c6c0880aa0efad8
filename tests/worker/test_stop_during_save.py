"""SIGTERM to ``nvtrain run`` while an asynchronous save is being written: the workers finish
and commit that save before they exit, so the pod's replacement resumes from it.

Real ``nvtrain run``, ft_launcher and 2 gloo ranks; the state is large enough (about 400 MB per
rank) that the write is still running when the signal arrives.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from support.worker_helpers import free_port_pair, kill_token, read_events, start_nvtrain, write_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SAVE_STEP = 2


def test_sigterm_during_an_async_write_commits_it_then_exits_143(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    tables = {
        "job": {
            "name": "stop-during-save",
            "module": "nvtrain.demo",
            "args": [
                "--steps",
                "200",
                "--step-time",
                "0",
                "--log-every",
                "1",
                "--width",
                "4096",
                "--depth",
                "3",
            ],
            "nproc_per_node": 2,
            "backend": "gloo",
            "collective_timeout": "15s",
            "stop_timeout": "40s",
            "warm_start": True,  # the workers forked from one import, not two
        },
        "rendezvous": {"nodes": 1, "port": free_port_pair(), "join_timeout": "60s"},
        "heartbeat": {"initial_timeout": "90s", "timeout": "60s", "monitor_interval": "1s"},
        "restart.in_process": {"enabled": True, "soft_timeout": "20s", "hard_timeout": "40s"},
        "checkpoint": {"dir": str(checkpoints), "interval": SAVE_STEP, "async": True, "keep": 2},
    }
    policy = write_policy(tmp_path / "stop.toml", tables)
    token = uuid.uuid4().hex
    run_id = "stop-during-save"
    events_path = checkpoints / run_id  # the run directory: every pod's events log
    proc = start_nvtrain(policy, run_id, tmp_path, tmp_path / "out.txt", token)
    try:
        deadline = time.monotonic() + 150
        staged: set[int] = set()
        while len(staged) < 2 and time.monotonic() < deadline and proc.poll() is None:
            if events_path.exists():
                staged = {
                    e["rank"]
                    for e in read_events(events_path)
                    if e["event"] == "checkpoint_staged" and e["step"] == SAVE_STEP
                }
            time.sleep(0.02)
        assert len(staged) == 2, (tmp_path / "out.txt").read_text(errors="replace")[-3000:]
        committed_before = [
            e
            for e in read_events(events_path)
            if e["event"] == "checkpoint_committed" and e["step"] == SAVE_STEP
        ]
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        left = kill_token(token)
    events = read_events(events_path)
    shown = [
        (e["event"], e.get("rank"), e.get("step"), e.get("finished"), e.get("signal"))
        for e in events
        if e["event"].startswith(
            ("checkpoint_settled", "checkpoint_committed", "worker_", "signal", "launcher_")
        )
    ]
    # The signal came while the save was still being written, or the test proves nothing.
    assert committed_before == [], "the write had finished before the signal: make the state larger"
    assert code == 128 + signal.SIGTERM, shown
    assert left == [], f"processes outlived nvtrain: {left}"
    folder = checkpoints / run_id / f"step-{SAVE_STEP:06d}"
    assert (folder / "COMMITTED").is_file(), (shown, sorted(p.name for p in folder.parent.iterdir()))
    committed = [e for e in events if e["event"] == "checkpoint_committed" and e["step"] == SAVE_STEP]
    assert len(committed) == 1, shown
    stopped = sorted(e["rank"] for e in events if e["event"] == "worker_stopped")
    assert stopped == [0, 1], shown

"""A hang in Python on a lone rank is caught by the in-process layer's soft timeout, in the
first attempt and again after an in-process restart.

With one rank no peer collective times out, so only NVRx's progress watchdog can see the hang.
Before the monitor process polled faster than the watchdog reports, its timeout checks almost
never ran and such a hang waited for the heartbeat timeout and a full in-job restart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.worker_helpers import free_port_pair, run_nvtrain, write_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FAULTS = [
    {"step": 12, "rank": 0, "kind": "hang"},  # first attempt
    {"step": 24, "rank": 0, "kind": "hang"},  # after an in-process restart
]


def test_lone_rank_hang_is_restarted_in_process_twice(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    tables = {
        "job": {
            "name": "lone-hang",
            "module": "nvtrain.demo",
            "args": ["--steps", "30", "--step-time", "0.02", "--log-every", "1"],
            "nproc_per_node": 1,
            "max_steps": 30,
            "backend": "gloo",
            "collective_timeout": "6s",
            "stop_timeout": "5s",
        },
        "rendezvous": {"nodes": 1, "port": free_port_pair(), "join_timeout": "60s"},
        # A hang the soft timeout misses is ended by the hard one (SIGTERM) or the heartbeat timeout.
        "heartbeat": {"initial_timeout": "60s", "timeout": "15s", "monitor_interval": "1s"},
        "restart.in_process": {
            "enabled": True,
            "max_attempts": 5,
            "soft_timeout": "3s",
            "hard_timeout": "10s",
        },
        "restart.in_job": {"max_restarts": 2},
        "checkpoint": {"dir": str(checkpoints), "interval": 5, "async": True, "keep": 2},
    }
    policy = write_policy(tmp_path / "hang.toml", tables, FAULTS)
    run = run_nvtrain(policy, "lone-hang", checkpoints, tmp_path, 200.0)
    events = run.events
    summary = [
        (e["event"], e.get("layer"), e.get("cause"), e.get("step"))
        for e in events
        if e["event"]
        in ("fault_injected", "restart_begin", "worker_failed", "hang_detected", "launcher_exit")
    ]
    assert run.code == 0, run.describe()
    assert not [e for e in events if e["event"] in ("worker_failed", "hang_detected")], summary
    restarts = [e for e in events if e["event"] == "restart_begin"]
    assert [(e["layer"], e["cause"]) for e in restarts] == [("in_process", "soft timeout")] * 2, summary
    assert all("SOFT_TIMEOUT" in e["detail"] for e in restarts), restarts

"""A slow save, an evaluation in ``ctx.section()`` and a final evaluation after
``ctx.training_done()``, each longer than the in-process soft timeout, are not taken for hangs:
no restart of any layer, the save is committed."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.worker_helpers import BIN, free_port_pair, run_nvtrain, write_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_slow_save_and_section_outlast_the_soft_timeout_without_a_restart(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    tables = {
        "job": {
            "name": "slow-stretches",
            "script": str(BIN / "slow_stretches.py"),
            "args": ["4"],  # seconds: twice the soft timeout
            "nproc_per_node": 1,
            "backend": "gloo",
            "collective_timeout": "6s",
            "stop_timeout": "5s",
        },
        "rendezvous": {"nodes": 1, "port": free_port_pair(), "join_timeout": "60s"},
        "heartbeat": {"initial_timeout": "60s", "timeout": "15s", "monitor_interval": "1s"},
        "restart.in_process": {
            "enabled": True,
            "max_attempts": 3,
            "soft_timeout": "2s",
            "hard_timeout": "10s",
        },
        "restart.in_job": {"max_restarts": 1},
        "checkpoint": {"dir": str(checkpoints), "interval": 5, "async": True, "keep": 2},
    }
    policy = write_policy(tmp_path / "slow.toml", tables)
    run = run_nvtrain(policy, "slow-stretches", checkpoints, tmp_path, 150.0)
    events = run.events
    shown = [(e["event"], e.get("layer"), e.get("cause"), e.get("step")) for e in events]
    assert run.code == 0, run.describe()
    assert "SLOW STRETCHES DONE" in run.output, run.describe()
    assert [e for e in events if e["event"] in ("restart_begin", "worker_failed", "hang_detected")] == [], (
        shown
    )
    assert 5 in [e["step"] for e in events if e["event"] == "checkpoint_committed"], shown

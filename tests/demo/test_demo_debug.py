"""The demo script without nvtrain: ``python -m nvtrain.demo`` (no NVTRAIN_* or torchrun
variables) is a one-rank debug run with the built-in defaults and exits 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.worker_helpers import FINGERPRINT_LINE, LOSS_LINE, child_env, run_python

pytestmark = pytest.mark.slow


def _debug_run(cwd: Path) -> tuple[str, list[tuple[str, str, str]]]:
    cwd.mkdir()
    env = child_env()
    assert not [k for k in env if k.startswith(("NVTRAIN_", "TORCHELASTIC_")) or k in ("RANK", "WORLD_SIZE")]
    done = run_python(
        ["-m", "nvtrain.demo", "--steps", "5", "--step-time", "0", "--log-every", "1"],
        cwd=cwd,
        timeout=100,
        env=env,
    )
    assert done.returncode == 0, done.stdout
    assert "DEMO rank 0/1 starts at step 1 (attempt 0, restart 0" in done.stdout, done.stdout
    fingerprints = FINGERPRINT_LINE.findall(done.stdout)
    assert [rank for rank, _ in fingerprints] == ["0"], done.stdout
    losses = LOSS_LINE.findall(done.stdout)
    assert [(step, total) for step, total, _ in losses] == [(str(s), "5") for s in range(1, 6)], done.stdout
    # No events log without nvtrain; no checkpoint either (the default interval is 1000 steps).
    assert list(cwd.rglob("events*.jsonl")) == [] and list(cwd.rglob("step-*")) == []
    return fingerprints[0][1], losses


def test_the_demo_runs_as_a_one_rank_debug_run_without_nvtrain(tmp_path: Path) -> None:
    first = _debug_run(tmp_path / "first")
    second = _debug_run(tmp_path / "second")
    assert first == second  # deterministic, like the distributed run

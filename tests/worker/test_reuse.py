"""``ctx.reuse``: a one-rank demo job keeps its model and optimizer across in-process restarts
(no rebuild), and still ends bitwise where the same run without faults ends; a fault before the
first checkpoint builds them afresh (nothing to restore into them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.worker_helpers import assert_clean_exit, demo_tables, run_nvtrain, write_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 30
FAULTS = [
    {"step": 3, "rank": 0, "kind": "exception"},  # before the first checkpoint: built again
    {"step": 12, "rank": 0, "kind": "exception"},  # kept: restored from memory into it
    {"step": 23, "rank": 0, "kind": "exception"},
]


def test_kept_model_is_restored_into_and_ends_like_a_clean_run(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    policy = demo_tables(checkpoints, name="reuse", ranks=1, steps=STEPS)
    clean = run_nvtrain(write_policy(tmp_path / "clean.toml", policy), "clean", checkpoints, tmp_path, 120)
    faulty = run_nvtrain(
        write_policy(tmp_path / "faulty.toml", policy, FAULTS), "faulty", checkpoints, tmp_path, 120
    )
    assert_clean_exit(clean)
    assert_clean_exit(faulty)
    assert sorted(clean.fingerprints()) == [0], clean.describe()
    assert faulty.fingerprints() == clean.fingerprints(), faulty.describe()
    events = faulty.events
    attempts = [e["iteration"] for e in events if e["event"] == "attempt_start"]
    reused = [e["iteration"] for e in events if e["event"] == "object_reused"]
    assert attempts == [0, 1, 2, 3], attempts
    assert reused == [2, 3], reused  # attempt 1 followed the fault at step 3: nothing to restore
    restored = [(e["step"], e["origin"]) for e in events if e["event"] == "checkpoint_restored"]
    assert restored == [(10, "memory"), (20, "memory")], restored

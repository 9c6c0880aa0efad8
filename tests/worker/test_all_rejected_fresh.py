"""A run whose every stored checkpoint is rejected starts afresh, bitwise: 2 ranks (gloo, the FSDP2
demo) under ``nvtrain run`` and the real ft_launcher, async checkpoints with the host copy on.

A first run of the demo trains ``STEPS`` steps from nothing and commits its checkpoints; then one
byte of a shard of each committed checkpoint is flipped (on storage, as a failing disk would). A
second run resuming that run id finds no usable checkpoint: the host copy has none (a new
launcher, a new folder), and storage rejects each one (``checkpoint_rejected``). It starts at
step 1 and must end with the fingerprints (model and optimizer shards, bitwise) that the first,
clean run of the same length and seed printed: the restore's reading of the state (which makes
AdamW's state with a step of its own) must leave nothing behind.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.proc_helpers import NvtrainRunner, make_policy, read_events, write_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 10
INTERVAL = 5
RUN_ID = "all-rejected"
FINGERPRINT = re.compile(r"DEMO rank (\d) finished fingerprint ([0-9a-f]{16})")
STARTS = re.compile(r"DEMO rank (\d)/2 starts at step (\d+)")


def _policy(tmp_path: Path) -> Path:
    _, tables = make_policy(
        tmp_path,
        module="nvtrain.demo",
        args=["--steps", str(STEPS), "--step-time", "0", "--log-every", "5"],
        nproc=2,
        max_restarts=0,
    )
    tables["job"].update({"max_steps": STEPS, "backend": "gloo"})
    tables["checkpoint"].update({"interval": INTERVAL, "async": True, "keep": 2})
    return write_policy(tmp_path, tables)


def _fingerprints(stdout: str) -> dict[int, str]:
    found = {int(rank): digest for rank, digest in FINGERPRINT.findall(stdout)}
    assert sorted(found) == [0, 1], stdout[-3000:]
    return found


def _flip_a_shard_byte(folder: Path) -> None:
    shard = sorted(folder.glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_a_run_whose_checkpoints_are_all_rejected_ends_like_a_clean_run(
    nvtrain: NvtrainRunner, tmp_path: Path
) -> None:
    policy = _policy(tmp_path)
    run_dir = tmp_path / "ckpt" / RUN_ID

    first = nvtrain.start("--run-id", RUN_ID, str(policy))
    assert first.wait(timeout=150) == 0, first.describe()
    clean = _fingerprints(first.stdout)
    committed = sorted(p for p in run_dir.glob("step-*") if (p / "COMMITTED").is_file())
    assert [p.name for p in committed] == ["step-000005", "step-000010"], committed
    for folder in committed:
        _flip_a_shard_byte(folder)

    second = nvtrain.start("--run-id", RUN_ID, str(policy))
    assert second.wait(timeout=150) == 0, second.describe()
    events = read_events(run_dir)
    resumed = [e for e in events if float(e["ts"]) >= _second_start(events)]
    rejected = sorted({e["step"] for e in resumed if e["event"] == "checkpoint_rejected"})
    assert rejected == [5, 10], resumed
    assert not [e for e in resumed if e["event"] == "checkpoint_restored"], resumed
    assert sorted(STARTS.findall(second.stdout)) == [("0", "1"), ("1", "1")], second.stdout[-3000:]
    assert _fingerprints(second.stdout) == clean, (clean, second.stdout[-3000:])


def _second_start(events: list[dict[str, object]]) -> float:
    """When the second run's launcher started (its events follow the first run's in one log)."""
    starts = [float(str(e["ts"])) for e in events if e["event"] == "launcher_start"]
    assert len(starts) == 2, starts
    return starts[1]

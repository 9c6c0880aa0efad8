"""The root cause names the rank that failed first, under the real ft_launcher (NVRx 0.4.1 on
CPU, gloo): rank 1 raises; rank 0's all-reduce breaks and it exits at once, so ft_launcher
usually finds both dead in one look and names local rank 0 (the lowest). nvtrain reads the
traceback torch.distributed printed for rank 1 and names it. Rarely (seen once, under
stress-ng) rank 1's exit aborts after its traceback ("terminate called without an active
exception", SIGABRT) and ft_launcher names rank 1 itself: its exception is still in the cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.proc_helpers import BIN, NvtrainRunner, make_policy, read_events

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("step", [3, 10, 30])
def test_the_root_cause_is_the_rank_that_raised(nvtrain: NvtrainRunner, tmp_path: Path, step: int) -> None:
    policy, _ = make_policy(
        tmp_path,
        script=str(BIN / "raise_worker.py"),
        args=["--raise-rank", "1", "--step", str(step)],
        max_restarts=0,
    )
    run = nvtrain.start(str(policy), env={"NVTRAIN_RUN_ID": f"root-{step}"})
    assert run.wait(timeout=100) == 1, run.describe()
    root = "Root cause (first failure): local rank 1 on pod "  # in the events log and on stderr
    events = read_events(tmp_path / "ckpt" / f"root-{step}")
    end = events[-1]
    assert end["event"] == "launcher_exit" and end["exit_code"] == 1, events
    assert root in end["cause"], end["cause"]
    assert f"raised RuntimeError: boom at step {step}" in end["cause"], end["cause"]
    assert root in run.stderr, run.describe()
    failures = [e for e in events if e["event"] == "worker_failed"]
    assert failures[0]["rank"] == 1 and failures[0]["raised"] == f"RuntimeError: boom at step {step}", (
        failures
    )

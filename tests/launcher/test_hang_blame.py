"""A hang is blamed on the rank that stopped, not on the peer that waited for it (issue 39).

Two ranks on gloo with NVRx heartbeats. Rank 1 hangs after step 2, but beats for 2.5 s more while
rank 0 already waits for it in the next all-reduce: rank 0's heartbeats stop first, so its rank
monitor fires first and names it, though it is healthy. With rank 1 stopped (SIGSTOP), nvtrain
finds it by its process state, blames it, and SIGKILLs it: it cannot act on the SIGTERM
ft_launcher sends, which used to hold the stop for the whole stop timeout. With rank 1 asleep in
Python, nothing tells the two apart, and the cause says "one of local ranks 0, 1".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.proc_helpers import BIN, NvtrainRunner, make_policy, read_events

pytestmark = pytest.mark.slow

STOP_TIMEOUT = 15.0
"""ft_launcher's workers-stop-timeout: long, so that a stop that waits for it shows."""


def named(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["event"] == name]


def run_hang(nvtrain: NvtrainRunner, tmp_path: Path, how: str) -> tuple[object, list[dict]]:
    policy, _ = make_policy(
        tmp_path,
        script=str(BIN / "stall_worker.py"),
        args=["--how", how],
        max_restarts=0,
        escalate_after=5,
        stop_timeout=f"{STOP_TIMEOUT:g}s",
    )
    run = nvtrain.start("--run-id", how, str(policy))
    code = run.wait(timeout=120)
    assert code == 1, run.describe()
    assert "WORKER HANG rank=1" in run.stdout, run.describe()
    return run, read_events(tmp_path / "ckpt" / how)


def test_a_stopped_rank_is_blamed_and_killed(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    run, events = run_hang(nvtrain, tmp_path, "stop")
    blamed = named(events, "hang_blamed")
    assert [(b.get("local_rank"), b.get("state")) for b in blamed] == [(1, "stopped")], events
    assert blamed[0]["rank"] == 1, blamed
    end = events[-1]
    assert end["event"] == "launcher_exit" and end["exit_code"] == 1, events
    assert "Root cause (first failure): a hang in local rank 1 " in end["cause"], end
    assert "its process was stopped" in end["cause"], end
    # No wait for the stop timeout: the stopped rank was killed as soon as the hang was seen.
    first_hang = named(events, "hang_detected")[0]["ts"]
    assert end["ts"] - first_hang < STOP_TIMEOUT / 2, (first_hang, end)


def test_a_hang_nothing_tells_apart_names_every_rank_it_may_be_in(
    nvtrain: NvtrainRunner, tmp_path: Path
) -> None:
    run, events = run_hang(nvtrain, tmp_path, "sleep")
    blamed = named(events, "hang_blamed")
    assert [b.get("candidates") for b in blamed] == [[0, 1]], events
    end = events[-1]
    assert "a hang in one of local ranks 0, 1" in end["cause"], end

"""Escalation stops the run at the configured count, whatever ft_launcher is doing (issue 39).

ft_launcher (NVRx 0.4.1) ignores a SIGTERM that lands between a restart's start and its next
rendezvous, and went on restarting: "failed 6 times in a row" with ``escalate_after = 3``. The
window is NVRx's clean-up of leftover processes in each restart (``terminate_mp_processes``): it
reads every process of the machine inside ``except Exception: pass``, which swallows the
exception its SIGTERM handler raises, so the window grows with the machine's process count. The
count test runs with a few hundred idle processes on the machine (``crowd``), which widens that
window: the SIGTERM that nvtrain used to send then went unheard in some runs (11 failures, the
whole budget of 10 restarts: 3 runs of 8 with 400 idle processes, 1 of 6 with 600). That only
makes a regression likelier to show; ``test_stop_frozen.py`` checks the mechanism itself.
nvtrain now freezes ft_launcher (SIGSTOP) as it reads the failure that makes the count, then
stops its tree. A failure before the first step that repeats with the same error stops the run
at its second occurrence, with the script's error in the cause. Real ``nvtrain run``, 2 ranks,
no torch import.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.proc_helpers import BIN, NvtrainRunner, make_policy, read_events

pytestmark = pytest.mark.slow

SCRIPT = str(BIN / "startup_raise_worker.py")
ERROR = "ValueError: unknown option 'lr_shedule'"
STOP_TIMEOUT = 15.0
"""Long, so that a stop that waits for it shows."""


CROWD = 400
"""Idle processes on the machine during the count test (a training node runs hundreds)."""


@pytest.fixture
def crowd() -> Iterator[None]:
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(CROWD)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def named(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["event"] == name]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_escalation_stops_at_exactly_escalate_after_failures(
    nvtrain: NvtrainRunner, tmp_path: Path, warm: bool, crowd: None
) -> None:
    # Each failure has its own message (--vary): the count rule, not the identical-error rule.
    policy, _ = make_policy(
        tmp_path,
        script=SCRIPT,
        args=["--vary"],
        max_restarts=10,
        escalate_after=3,
        stop_timeout=f"{STOP_TIMEOUT:g}s",
        warm_start=warm,
    )
    run = nvtrain.start("--run-id", "count", str(policy))
    code = run.wait(timeout=120)
    assert code == 4, run.describe()
    events = read_events(tmp_path / "ckpt" / "count")
    failed = [f for f in named(events, "worker_failed") if f.get("local_rank") == 1]
    assert len(failed) == 3, events
    # No fourth attempt started: ft_launcher was frozen before it could begin one.
    assert re.findall(r"WORKER START rank=1 restart=(\d+)", run.stdout) == ["0", "1", "2"], run.describe()
    [escalated] = named(events, "escalated")
    assert escalated["failures"] == 3, escalated
    assert "failed 3 times in a row" in escalated["reason"], escalated
    assert escalated["error"] == f"{ERROR} (attempt 2)", escalated
    end = events[-1]
    assert end["event"] == "launcher_exit" and end["exit_code"] == 4, events
    assert "[restart] escalate_after = 3" in end["cause"] and f"{ERROR} (attempt 2)" in end["cause"], end
    # The stop did not wait for stop_timeout: the workers end on TERM at once.
    assert end["ts"] - escalated["ts"] < STOP_TIMEOUT - 5, (escalated, end)


def test_a_startup_error_that_repeats_exactly_stops_at_its_second_failure(
    nvtrain: NvtrainRunner, tmp_path: Path
) -> None:
    policy, _ = make_policy(
        tmp_path, script=SCRIPT, max_restarts=10, escalate_after=5, stop_timeout=f"{STOP_TIMEOUT:g}s"
    )
    run = nvtrain.start("--run-id", "same", str(policy))
    code = run.wait(timeout=120)
    assert code == 4, run.describe()
    events = read_events(tmp_path / "ckpt" / "same")
    failed = [f for f in named(events, "worker_failed") if f.get("local_rank") == 1]
    assert len(failed) == 2, events
    assert re.findall(r"WORKER START rank=1 restart=(\d+)", run.stdout) == ["0", "1"], run.describe()
    [escalated] = named(events, "escalated")
    assert escalated["failures"] == 2 and escalated["error"] == ERROR, escalated
    end = events[-1]
    assert end["event"] == "launcher_exit" and end["exit_code"] == 4, events
    assert "local rank 1 failed 2 times in a row before the first step" in end["cause"], end
    assert ERROR in end["cause"], end
    assert ERROR in run.stderr, run.describe()

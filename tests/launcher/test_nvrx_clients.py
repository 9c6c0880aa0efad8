"""Scripts written for ft_launcher, on NVRx's client API alone, under ``nvtrain run``.

The policy leaves the heartbeat timeouts unset, so NVRx sees None (its own behaviour: no fixed
timeout until the workers compute one), even on NVRx 0.4.1 whose defaults are 3600 s and 2700 s:
nvtrain passes ``[heartbeat]`` as NVRx's config file (``--ft-cfg-path``). A heartbeats client
computes its timeouts after a few steps, as NVRx's examples do, and a sections client opens the
sections the policy declares (0.4.1 rejects an unknown one). Real ft_launcher, 2 ranks, gloo.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from support.proc_helpers import BIN, NvtrainRunner, make_policy, read_events, write_policy

pytestmark = pytest.mark.slow

MONITOR_INTERVAL = 1.0
STEP_TIME = 0.5


def client_policy(tmp_path: Path, args: list[str], heartbeat: dict[str, Any]) -> Path:
    _, tables = make_policy(
        tmp_path, script=str(BIN / "nvrx_client.py"), args=args, max_restarts=2, warm_start=True
    )
    tables["heartbeat"] = {"monitor_interval": f"{MONITOR_INTERVAL}s", **heartbeat}
    return write_policy(tmp_path, tables)


def events_of(tmp_path: Path, run_id: str) -> list[dict[str, Any]]:
    return read_events(tmp_path / "ckpt" / run_id)


def hang_time(stdout: str) -> float:
    match = re.search(r"CLIENT HANG rank=1 step=\d+ t=([\d.]+)", stdout)
    assert match, stdout
    return float(match.group(1))


def test_computed_heartbeat_timeouts_catch_a_hang(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    args = ["--mode", "heartbeats", "--step-time", str(STEP_TIME), "--calc-step", "4", "--hang-step", "6"]
    policy = client_policy(tmp_path, args, {})
    run = nvtrain.start("--run-id", "hb-1", str(policy))
    assert run.wait(timeout=120) == 0, run.describe()
    out = run.stdout
    # NVRx saw no timeouts (not 0.4.1's 3600/2700 s): the client computed them, from 0.5 s steps.
    timeouts = re.findall(
        r"CLIENT TIMEOUTS rank=\d HeartbeatTimeouts\(initial=([\d.]+), subsequent=([\d.]+)", out
    )
    assert len(timeouts) == 2, run.describe()
    subsequent = max(float(s) for _, s in timeouts)
    assert subsequent < 60, timeouts
    events = events_of(tmp_path, "hb-1")
    hangs = [e for e in events if e["event"] == "hang_detected"]
    # NVRx 0.4 names the worker by its rank, 0.6/0.7 by its local rank: one node, the same here.
    named_rank = hangs[0].get("rank", hangs[0].get("local_rank")) if hangs else None
    assert named_rank == 1 and hangs[0]["heartbeat"] == "subsequent", run.describe()
    detected = hangs[0]["ts"] - hang_time(out)
    # The computed timeout, one monitor poll, and the time to read the line (loaded machine).
    assert subsequent - 1.0 < detected < subsequent + MONITOR_INTERVAL + 10.0, (detected, subsequent)
    failed = [e for e in events if e["event"] == "worker_failed" and e.get("signal") == "SIGKILL"]
    assert failed, run.describe()
    assert out.count("CLIENT DONE rank=0 restart=1") == out.count("CLIENT DONE rank=1 restart=1") == 1, out
    # The restarted workers kept the computed timeouts (the rank monitors keep them): no second calculation.
    assert len(re.findall(r"CLIENT TIMEOUTS", out)) == 2, out


def test_sections_run_to_the_end_and_a_stalled_step_is_caught(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    args = [
        "--mode",
        "sections",
        "--step-time",
        "0.2",
        "--steps",
        "10",
        "--save-every",
        "4",
        "--hang-step",
        "5",
    ]
    heartbeat = {
        "sections": {"init": "60s", "step": "3s", "checkpoint": "auto"},
        "out_of_section_timeout": "30s",
    }
    policy = client_policy(tmp_path, args, heartbeat)
    run = nvtrain.start("--run-id", "sec-1", str(policy))
    assert run.wait(timeout=120) == 0, run.describe()
    out = run.stdout + run.stderr
    assert "Unknown section" not in out and "RankMonitorClientError" not in out, run.describe()
    assert re.search(r"Section 'step' has been open for [\d.]+ seconds", out), run.describe()
    events = events_of(tmp_path, "sec-1")
    hangs = [e for e in events if e["event"] == "hang_detected"]
    assert hangs and {e.get("section") for e in hangs} == {"step"}, hangs
    assert all(e.get("heartbeat") is None for e in hangs), hangs
    failed = [e for e in events if e["event"] == "worker_failed" and e.get("signal") == "SIGKILL"]
    assert failed, run.describe()
    restarts = [e for e in events if e["event"] == "restart_begin" and e.get("layer") == "in_job"]
    assert len(restarts) == 1, run.describe()
    assert (
        run.stdout.count("CLIENT DONE rank=0 restart=1")
        == run.stdout.count("CLIENT DONE rank=1 restart=1")
        == 1
    )

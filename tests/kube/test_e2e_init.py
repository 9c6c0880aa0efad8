"""From nothing to a finished run on CPU: ``nvtrain init``, ``nvtrain validate``, then
``nvtrain run`` of the starter policy set for one CPU machine (2 ranks, gloo, a few steps)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from templates_helpers import set_keys
from typer.testing import CliRunner

from nvtrain.cli import app
from support.ports import free_port_pair

STEPS = 30


def for_cpu(text: str, port: int, checkpoints: Path) -> str:
    """The starter policy on one CPU machine: what the header of the starter says to change, plus
    short timeouts and few steps so the test is quick."""
    return set_keys(
        text,
        {
            ("job", "nproc_per_node"): "2",
            ("job", "backend"): '"gloo"',
            ("job", "collective_timeout"): '"8s"',
            ("job", "max_steps"): str(STEPS),
            ("job", "args"): '["--width", "32", "--log-every", "10"]',
            ("job", "stop_timeout"): '"10s"',
            ("rendezvous", "nodes"): "1",
            ("rendezvous", "port"): str(port),
            ("rendezvous", "join_timeout"): '"60s"',
            ("heartbeat", "initial_timeout"): '"60s"',
            ("heartbeat", "timeout"): '"20s"',
            ("heartbeat", "monitor_interval"): '"1s"',
            ("restart.in_process", "soft_timeout"): '"10s"',
            ("restart.in_process", "hard_timeout"): '"15s"',
            ("checkpoint", "dir"): f'"{checkpoints.as_posix()}"',
            ("checkpoint", "interval"): "10",
            ("checkpoint", "keep"): "2",
        },
    )


def clean_env() -> dict[str, str]:
    drop = (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "JOB_COMPLETION_INDEX",
        "POD_IP",
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith(("TORCHELASTIC_", "NVTRAIN_", "PET_", "FT_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_init_validate_and_run_the_starter_on_cpu(tmp_path: Path) -> None:
    project = tmp_path / "project"
    runner = CliRunner()
    result = runner.invoke(app, ["init", str(project)])
    assert result.exit_code == 0, result.output
    policy = project / "policy.toml"
    result = runner.invoke(app, ["validate", str(policy), "--strict"])
    assert result.exit_code == 0, result.output

    checkpoints = tmp_path / "checkpoints"
    policy.write_text(
        for_cpu(policy.read_text(encoding="utf-8"), free_port_pair(), checkpoints), encoding="utf-8"
    )
    result = runner.invoke(app, ["validate", str(policy), "--strict"])
    assert result.exit_code == 0, result.output

    log = tmp_path / "run.log"
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nvtrain", "run", "--run-id", "e2e-starter", str(policy)],
            cwd=project,  # [job] script = "train.py", as in the image's WORKDIR
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code = proc.wait(timeout=100)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    output = log.read_text(encoding="utf-8", errors="replace")
    took = time.monotonic() - started
    assert code == 0, f"exit {code} after {took:.0f}s:\n{output[-6000:]}"
    assert f"TRAIN finished {STEPS} steps" in output
    assert re.search(r"TRAIN 2 ranks, steps 1\.\.30", output), output[-3000:]
    run_dir = checkpoints / "e2e-starter"
    committed = sorted(p.name for p in run_dir.glob("step-*") if (p / "COMMITTED").is_file())
    assert committed == ["step-000020", "step-000030"], sorted(p.name for p in run_dir.iterdir())

"""End to end on CPU: a real ``nvtrain run`` of the demo job with one fault, then
``tune-interval --from-run`` on its run directory."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nvtrain.cli import app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def demo_policy(directory: Path) -> Path:
    path = directory / "policy.toml"
    path.write_text(
        f"""\
[job]
name = "tune-demo"
module = "nvtrain.demo"
args = ["--steps", "40", "--step-time", "0.02"]
nproc_per_node = 2
backend = "gloo"
collective_timeout = "8s"

[rendezvous]
port = {free_port()}
dns_timeout = "30s"
join_timeout = "60s"

[restart.in_process]
soft_timeout = "10s"
hard_timeout = "15s"

[checkpoint]
dir = "{directory / "ckpt"}"
interval = 10
keep = 2

[[faults]]
step = 25
rank = 1
kind = "exception"
""",
        encoding="utf-8",
    )
    return path


def run_demo(policy: Path, run_id: str) -> str:
    """``python -m nvtrain run``; on a hang, SIGTERM (nvtrain stops its whole tree), then SIGKILL."""
    child = subprocess.Popen(
        [sys.executable, "-m", "nvtrain", "run", str(policy), "--run-id", run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=policy.parent,
        start_new_session=True,
    )
    try:
        out, _ = child.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGTERM)
        try:
            out, _ = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, _ = child.communicate()
        pytest.fail(f"nvtrain run did not finish in 300 s:\n{out[-4000:]}")
    assert child.returncode == 0, out[-4000:]
    return out


def test_tune_interval_from_a_real_cpu_run(tmp_path: Path) -> None:
    policy = demo_policy(tmp_path)
    run_id = f"tune-{uuid.uuid4().hex[:8]}"
    run_demo(policy, run_id)
    run_dir = tmp_path / "ckpt" / run_id
    assert (run_dir / "events-node0.jsonl").is_file()

    runner = CliRunner()
    args = ["tune-interval", "--from-run", str(run_dir), "--mtbf", "6h", "--policy", str(policy)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    counts = data["measured"]["counts"]
    assert counts["step"] >= 4 and counts["save_block"] >= 4 and counts["save_write"] >= 2
    assert counts["restart_in_process"] == 1  # the exception at step 25
    assert data["inputs"]["from"]["restart"].startswith("measured: in-process")
    assert 0 < data["inputs"]["step_s"] < 5
    best = data["recommended"]["async"]
    assert best["interval_steps"] >= best["floor_steps"]
    assert data["current"]["interval_steps"] == 10
    for outcome in (best, data["current"]["async"], data["current"]["sync"]):
        assert 0.0 <= outcome["efficiency"] <= 1.0

    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    assert "recommended  async" in shown.stdout and "current      async" in shown.stdout

"""Hang detection for a script on NVRx's client API alone (tests/support/bin/nvrx_client.py):
``nvtrain run`` vs bare ft_launcher with the same fault-tolerance config (no heartbeat timeouts,
``null``; the client computes them after 4 steps of 0.5 s). Rank 1 stops itself at step 6.

Measured per run: hang -> the rank monitor's "Did not get subsequent heartbeat" line, as read
from the launcher's output by this script (the moment nvtrain's events log gets
``hang_detected``), and hang -> the restarted rank 1's start. Prints the medians as JSON.

    .venv/bin/python benchmarks/hang_detection_nvrx_client.py --runs 5
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _lib import REPO as ROOT
from _lib import cli
from _lib.policy import toml_list
from _lib.procs import free_port, nvtrain_argv

CLIENT = ROOT / "tests" / "support" / "bin" / "nvrx_client.py"
ARGS = ["--mode", "heartbeats", "--step-time", "0.5", "--calc-step", "4", "--hang-step", "6"]
HANG = re.compile(r"CLIENT HANG rank=1 step=\d+ t=([\d.]+)")
RESTARTED = re.compile(r"CLIENT START rank=1 restart=1 t=([\d.]+)")
TIMEOUTS = re.compile(r"CLIENT TIMEOUTS rank=1 HeartbeatTimeouts\(initial=[\d.]+, subsequent=([\d.]+)")


def policy_text(folder: Path, port: int) -> str:
    return f"""[job]
name = "bench"
script = "{CLIENT}"
args = {toml_list(ARGS)}
nproc_per_node = 2
stop_timeout = "3s"
[rendezvous]
port = {port}
[heartbeat]
monitor_interval = "1s"
[restart.in_process]
enabled = false
[restart.in_job]
max_restarts = 2
[checkpoint]
dir = "{folder / "ckpt"}"
"""


def measure(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen: dict[str, float] = {}
    for line in proc.stdout:
        now = time.time()
        if "Did not get subsequent heartbeat" in line and "detected" not in seen:
            seen["detected"] = now
        for name, regex in (("hang", HANG), ("restarted", RESTARTED), ("timeout", TIMEOUTS)):
            match = regex.search(line)
            if match and name not in seen:
                seen[name] = float(match.group(1))
    code = proc.wait()
    assert code == 0 and {"hang", "detected", "restarted"} <= seen.keys(), (code, seen)
    return {
        "computed_timeout_s": seen["timeout"],
        "detection_s": seen["detected"] - seen["hang"],
        "restarted_s": seen["restarted"] - seen["hang"],
    }


def _no_nic_checks() -> list[str]:
    """What nvtrain passes on a machine without InfiniBand, per NVRx version."""
    from nvtrain.nvrx import installed_nvrx

    version = installed_nvrx()
    if version is not None and version.supports_min_healthy:  # 0.4
        return ["--ft-enable-nic-monitor=false"]
    return ["--ft-enable-nic-healthcheck=false"]


def run_once(kind: str) -> dict[str, float]:
    from nvtrain.config.schema import Policy
    from nvtrain.launcher.plan import ft_config_text

    with tempfile.TemporaryDirectory(prefix="nvt-") as tmp:
        folder, port = Path(tmp), free_port()
        text = policy_text(folder, port)
        (folder / "policy.toml").write_text(text, encoding="utf-8")
        env = {**os.environ, "TMPDIR": tmp, "PYTHONUNBUFFERED": "1"}
        if kind == "nvtrain":
            argv = nvtrain_argv("run", "--run-id", "bench", str(folder / "policy.toml"))
            return measure(argv, env)
        import tomllib

        policy = Policy.model_validate(tomllib.loads(text))
        cfg = folder / "ft_config.yaml"
        cfg.write_text(ft_config_text(policy.heartbeat), encoding="utf-8")
        argv = [
            sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher",
            "--nnodes=1:1", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=bench", "--max-restarts=2",
            "--monitor-interval=1", f"--ft-cfg-path={cfg}", *_no_nic_checks(),
            str(CLIENT), *ARGS,
        ]  # fmt: skip
        return measure(argv, env)


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    results: dict[str, dict[str, object]] = {}
    for kind in ("nvtrain", "ft_launcher"):
        samples = [run_once(kind) for _ in range(runs)]
        results[kind] = {key: round(statistics.median(s[key] for s in samples), 3) for key in samples[0]} | {
            "runs": runs,
            "samples": samples,
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

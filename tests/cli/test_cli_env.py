"""``nvtrain env``: what it reports is what this machine has, for each platform nvtrain knows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

from support.worker_helpers import child_env

PLATFORM_ENV = {
    "bare metal": {},
    "Kubernetes pod (Indexed Job, index 3)": {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "JOB_COMPLETION_INDEX": "3",
    },
    "Slurm task (job 77, node 1 of 2)": {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_NODEID": "1",
        "SLURM_NNODES": "2",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "n1,n2",
        "SLURM_PROCID": "1",
    },
}


def env_cmd(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in child_env().items() if not k.startswith(("SLURM_", "KUBERNETES_", "JOB_COMPLETION"))
    }
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", "nvtrain", "env", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_env_reports_what_this_machine_has() -> None:
    done = env_cmd("--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # torch's pynvml FutureWarning among others: nothing
    found = json.loads(done.stdout)
    assert found["torch"] == metadata.version("torch")
    nvrx = metadata.version("nvidia-resiliency-ext")
    assert found["nvrx"].startswith(f"{nvrx} (tested; in-process restart available")
    assert found["torch_cuda_build"] == "none (a CPU build)" and found["gpus"] == "none"  # CI's CPU build
    assert found["transformers"] == metadata.version("transformers")
    assert found["platform"].startswith("bare metal")
    assert found["python"].startswith(".".join(map(str, sys.version_info[:3])))
    usable = len(os.sched_getaffinity(0))
    assert found["cpus"].startswith(str(usable))


@pytest.mark.parametrize("platform", list(PLATFORM_ENV))
def test_env_names_the_platform(platform: str) -> None:
    done = env_cmd("--no-torch", **PLATFORM_ENV[platform])
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("platform"))
    assert line.split(None, 1)[1].startswith(platform), line


def test_no_torch_imports_no_torch() -> None:
    code = (
        "import sys, json; from typer.testing import CliRunner; from nvtrain.cli import app; "
        "r = CliRunner().invoke(app, ['env', '--no-torch', '--json']); "
        "print(json.dumps([r.exit_code, 'torch' in json.loads(r.stdout), 'torch' in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, False, False], done.stderr

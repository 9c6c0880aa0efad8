"""``--nproc-per-node gpu`` (or ``[job] nproc_per_node = "gpu"``) on a node without a GPU is exit 2
before anything starts, naming the flag or key and the fix (it was ft_launcher's exit 1 seconds
later: "Cuda is not available")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.worker_helpers import child_env

pytestmark = pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has a GPU")


def nvtrain_run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvtrain", "run", *args],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_flag_is_refused_at_once(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('ran')\n", encoding="utf-8")
    done = nvtrain_run(tmp_path, "--nproc-per-node", "gpu", "train.py")
    assert done.returncode == 2, done.stderr
    text = " ".join(done.stderr.split())
    assert "--nproc-per-node gpu starts one worker per GPU, and this node has none" in text
    assert "launcher_start" not in done.stderr and "ran" not in done.stdout


def test_the_key_is_refused_at_once(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('ran')\n", encoding="utf-8")
    policy = tmp_path / "p.toml"
    policy.write_text('[job]\nname = "g"\nscript = "train.py"\nnproc_per_node = "gpu"\n', encoding="utf-8")
    done = nvtrain_run(tmp_path, str(policy))
    assert done.returncode == 2, done.stderr
    assert '[job] nproc_per_node = "gpu" starts one worker per GPU' in " ".join(done.stderr.split())

"""``nvtrain.nvrx.ftmain`` patches only where the installed NVRx meets its contract: a real
ft_launcher run on a copy of NVRx 0.4.1 with a recorded private name renamed, or with a version
nvtrain was never tested on, runs unpatched and says so in one line."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from support.ports import free_port

PACKAGE = "nvidia_resiliency_ext"
LAUNCHER = f"{PACKAGE}.fault_tolerance.launcher"


def _nvrx_copy(to: Path, version: str | None = None) -> Path:
    """A copy of the installed NVRx (0.4.1) and its metadata under ``to`` (first on PYTHONPATH)."""
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.submodule_search_locations
    package = Path(next(iter(spec.submodule_search_locations)))
    shutil.copytree(package, to / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    info = next(package.parent.glob("nvidia_resiliency_ext-*.dist-info"))
    shutil.copytree(info, to / info.name)
    if version is not None:
        metadata = to / info.name / "METADATA"
        text = re.sub(r"(?m)^Version: .*$", f"Version: {version}", metadata.read_text(encoding="utf-8"))
        metadata.write_text(text, encoding="utf-8")
    return to


def _run(site: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text("print('trained', flush=True)\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTRAIN_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    port = free_port()
    argv = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=contract"]
    argv += ["--nnodes=1", "--nproc-per-node=1", "--monitor-interval=0.1"]
    argv += ["--ft-enable-nic-monitor=false", str(script)]
    return subprocess.run(
        [sys.executable, "-m", "nvtrain.nvrx.ftmain", LAUNCHER, *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "[WARNING]" in line and "nvtrain ftmain:" in line]


def test_a_renamed_private_name_turns_its_speedup_off_and_the_launcher_still_runs(tmp_path: Path) -> None:
    site = _nvrx_copy(tmp_path / "site")
    launcher = site / PACKAGE / "fault_tolerance" / "launcher.py"
    text = launcher.read_text(encoding="utf-8")
    old = "_invoke_run_with_any_failed_policy"
    assert old in text
    launcher.write_text(text.replace(old, "_run_any_failed"), encoding="utf-8")  # same program
    done = _run(site, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained" in done.stdout
    [line] = _warnings(done.stderr)
    assert "speed-ups off (monitor loop woken by child exits)" in line
    assert f"LocalElasticAgent.{old} is missing" in line and "contract of 0.4.1" in line
    assert "nvtrain ftmain: as shipped" in done.stderr


def test_an_untested_version_runs_unpatched_with_one_line(tmp_path: Path) -> None:
    site = _nvrx_copy(tmp_path / "site", version="0.8.0")
    done = _run(site, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained" in done.stdout
    [line] = _warnings(done.stderr)
    assert "NVRx 0.8.0 is not a tested release (tested: 0.4, 0.6, 0.7)" in line
    assert "without its speed-ups (monitor loop woken by child exits;" in line
    assert "nvtrain ftmain: as shipped" in done.stderr


def test_the_installed_release_gets_its_speedups_without_a_warning(tmp_path: Path) -> None:
    site = _nvrx_copy(tmp_path / "site")
    done = _run(site, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _warnings(done.stderr) == []
    assert "nvtrain ftmain: monitor loop woken by child exits" in done.stderr

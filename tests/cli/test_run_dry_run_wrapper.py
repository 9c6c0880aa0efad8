"""``nvtrain run --dry-run`` shows what the workers pass to NVRx's in-process ``Wrapper``: a
section on stderr after the launch plan, whose JSON on stdout is unchanged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from nvtrain.cli import app
from nvtrain.nvrx import installed_nvrx

runner = CliRunner()


@pytest.fixture(autouse=True)
def _off_kubernetes_and_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("SLURM_", "SLURMD_")) or name in (
            "KUBERNETES_SERVICE_HOST",
            "JOB_COMPLETION_INDEX",
        ):
            monkeypatch.delenv(name)


def _dry_run(tmp_path: Path, extra: str = "") -> Result:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        f'[job]\nname = "wrap"\nscript = "train.py"\nnproc_per_node = 2\n{extra}'
        f'[checkpoint]\ndir = "{tmp_path / "ckpt"}"\n',
        encoding="utf-8",
    )
    result = runner.invoke(app, ["run", "--dry-run", "--run-id", "wrap-1", str(policy)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["env"]["NVTRAIN_RUN_ID"] == "wrap-1"  # stdout: the plan, JSON only
    return result


def _section(stderr: str) -> dict[str, str]:
    _, _, body = stderr.partition("in-process restart (NVRx Wrapper), with ")
    assert body, stderr
    rows = {}
    for line in body.splitlines()[1:]:
        name, _, value = line.strip().partition(" = ")
        rows[name] = value
    return rows


def test_the_section_lists_the_wrapper_arguments(tmp_path: Path) -> None:
    result = _dry_run(
        tmp_path,
        '[restart.in_process]\nsoft_timeout = "20s"\nhard_timeout = "40s"\nmax_attempts = 4\n'
        'failure_window = "50ms"\n',
    )
    version = installed_nvrx()
    title = f"in-process restart (NVRx Wrapper), with NVRx {version} (installed):"
    assert (title if version is not None else "with no NVRx installed here") in result.stderr
    rows = _section(result.stderr)
    assert rows["soft_timeout"] == "20s" and rows["hard_timeout"] == "40s"
    assert rows["barrier_timeout"] == rows["completion_timeout"] == "1m10s"  # 40 s + 30 s
    assert rows["heartbeat_timeout"] == "20s"
    assert rows["heartbeat_interval"] == rows["progress_watchdog_interval"] == "1s"
    assert rows["monitor_process_interval"] == "250ms"
    assert rows["monitor_thread_interval"] == "100ms"
    assert rows["last_call_wait"].startswith("50ms")
    assert rows["RetryController max_iterations"] == "4"
    assert rows["RetryController min_world_size"] == "2"  # one node x 2 workers


def test_a_world_known_only_on_the_node_is_said_so(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[job]\nname = "wrap"\nscript = "train.py"\nnproc_per_node = "gpu"\n'
        f'[checkpoint]\ndir = "{tmp_path}"\n',
        encoding="utf-8",
    )
    result = runner.invoke(app, ["run", "--dry-run", str(policy)])
    assert result.exit_code == 0, result.output
    rows = _section(result.stderr)
    assert rows["RetryController min_world_size"] == "every rank (set on the node)"
    assert rows["monitor_thread_interval"] == "set on the node (world size)"


def test_in_process_restart_off_is_one_line(tmp_path: Path) -> None:
    result = _dry_run(tmp_path, "[restart.in_process]\nenabled = false\n")
    assert "in-process restart (NVRx Wrapper): off ([restart.in_process] enabled = false)" in result.stderr
    assert "soft_timeout =" not in result.stderr


def test_a_plain_script_gets_no_in_process_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A torchrun script that never imports nvtrain: the workers never build a Wrapper.
    (tmp_path / "train.py").write_text("import torch.distributed as dist\ndist.init_process_group()\n")
    monkeypatch.chdir(tmp_path)
    result = _dry_run(tmp_path)
    assert "in-process restart (NVRx Wrapper): off (the script does not use nvtrain's worker library" in (
        result.stderr
    )
    assert "soft_timeout" not in result.stderr

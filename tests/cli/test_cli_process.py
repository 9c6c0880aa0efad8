"""The installed command in a real process: ``python -m nvtrain`` with pipes, not a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nvtrain.config.reference import schema_json

POLICIES = Path(__file__).resolve().parents[1] / "config" / "policies"


def nvtrain(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")
    }
    env["COLUMNS"] = str(columns)
    result = subprocess.run(
        [sys.executable, "-m", "nvtrain", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in result.stderr
    assert "\x1b[" not in result.stdout + result.stderr  # no colour codes in pipes
    return result


def test_version() -> None:
    result = nvtrain("--version")
    assert (result.returncode, result.stdout, result.stderr) == (0, "nvtrain 0.1.0\n", "")


def test_invalid_policy() -> None:
    path = POLICIES / "invalid" / "checkpoint_rules.toml"
    result = nvtrain("validate", str(path), "--nvrx", "0.4.1")
    assert result.returncode == 2
    assert result.stdout == ""
    # The relative [checkpoint] dir is resolved where the command started, as `nvtrain run`
    # does (an info, issue 39); keep = 1 is the error.
    here = Path.cwd() / "checkpoints" / "ckpt"
    assert result.stderr.splitlines() == [
        f"nvtrain: {path}: 1 error",
        f'  {path}:7:1: info [checkpoint] dir = "checkpoints/ckpt"',
        f"      relative: resolved against the folder nvtrain started in, here {here}",
        "      fix: none needed to run from here (`nvtrain run` resolves it alike); a Kubernetes pod "
        "needs the checkpoint volume's absolute path",
        f"  {path}:9:1: error [checkpoint] keep = 1",
        "      must be >= 2 with async saves: the last complete checkpoint must survive while the next "
        "one is written",
        "      fix: use keep = 2 or more, or async = false",
    ]


def test_json_and_schema() -> None:
    report = nvtrain("validate", "--json", "--nvrx", "0.7.0")
    assert report.returncode == 0
    data = json.loads(report.stdout)
    assert (data["valid"], data["nvrx"], data["errors"]) == (True, "0.7.0", 0)
    schema = nvtrain("schema")
    assert (schema.returncode, schema.stdout) == (0, schema_json())


def test_bad_nvrx_value() -> None:
    result = nvtrain("validate", "--nvrx", "not-a-version")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "nvtrain: error: --nvrx 'not-a-version' is not a version",
        "  fix: give a version such as 0.4.1 or 0.7.0",
    ]


def test_effective_policy_shows_whole_values_in_a_narrow_pipe() -> None:
    # Today the table is cut to 80 columns and values end in "…", e.g.
    # "/tmp/nvtrain-demo/checkp…": the effective policy in a CI log is then incomplete.
    result = nvtrain("validate", "--nvrx", "0.4.1", columns=80)
    assert result.returncode == 0
    assert '"/tmp/nvtrain-demo/checkpoints"' in result.stdout
    assert "…" not in result.stdout

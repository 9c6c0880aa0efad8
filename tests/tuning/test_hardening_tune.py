"""Reliability review: ``tune-interval`` on extreme numbers (once tracebacks) and ``--apply`` on a
read-only policy (once rewritten by rename)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from nvtrain.cli import app
from nvtrain.errors import UsageError
from nvtrain.tuning.apply import apply_interval

runner = CliRunner()
TIMINGS = ["--step-time", "1s", "--save-block", "1s", "--save-write", "10s"]
POLICY = """\
[job]
name = "llm"
script = "train.py"

[checkpoint]
interval = 1000
"""


def tune(*args: str) -> Result:
    result = runner.invoke(app, ["tune-interval", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--step-time", "5e-324", "--save-block", "1s", "--save-write", "10s", "--mtbf", "8h"],
         "--step-time 5e-324 is shorter than 1e-06s (a microsecond)"),
        ([*TIMINGS, "--mtbf", "1e308"], "--mtbf 1e308 is longer than 1000000h"),
        ([*TIMINGS, "--mtbf", "8h", "--write-margin", "inf"], "--write-margin inf must be a number from 1"),
        ([*TIMINGS, "--mtbf", "8h", "--write-margin", "nan"], "--write-margin nan must be a number from 1"),
        ([*TIMINGS, "--mtbf", "8h", "--write-margin", "1e9"], "--write-margin 1e+09 must be a number from 1"),
        ([*TIMINGS, "--mtbf", "8h", "--write-margin", "0.5"], "--write-margin 0.5 is below 1"),
        ([*TIMINGS, "--gpus", str(10**12), "--gpu-mtbf", "8000h"], "--gpus 1000000000000 is more GPUs"),
        ([*TIMINGS, "--nodes", str(10**8), "--node-mtbf", "8000h"], "--nodes 100000000 is more nodes"),
        ([*TIMINGS, "--mtbf", "8h", "--restart", "1e300"], "--restart 1e300 is longer than"),
    ],
)  # fmt: skip
def test_extreme_numbers_are_usage_errors(args: list[str], message: str) -> None:
    result = tune(*args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_the_range_limits_themselves_compute() -> None:
    result = tune(
        "--step-time", "0.000001", "--save-block", "1000000h", "--save-write", "1000000h",
        "--mtbf", "1000000h", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    tiny = tune(
        "--step-time", "0.000001", "--save-block", "0.000001", "--save-write", "0.000001",
        "--gpus", "10000000", "--gpu-mtbf", "0.000001", "--json",
    )  # fmt: skip
    assert tiny.exit_code == 0, tiny.stderr


def test_a_model_overflow_is_a_usage_error(tmp_path: Path) -> None:
    """A policy interval beyond any float: the model cannot compute it."""
    path = tmp_path / "p.toml"
    path.write_text(POLICY.replace("1000", "1" + "0" * 400), encoding="utf-8")
    result = tune(*TIMINGS, "--mtbf", "8h", "--policy", str(path))
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "nvtrain: error: tune-interval cannot compute an interval from these timings (step 1s, "
        "save block 1s, save write 10s, MTBF 8h)"
    )


def test_apply_refuses_a_read_only_policy(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(POLICY, encoding="utf-8")
    path.chmod(0o444)
    inode = path.stat().st_ino
    result = tune(*TIMINGS, "--mtbf", "8h", "--apply", str(path))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"nvtrain: error: --apply: {path} is read-only (mode -r--r--r--), so its interval is left as it is",
        f"  fix: make it writable (chmod u+w {path}) to apply the interval, or leave out --apply",
    ]
    assert path.read_text(encoding="utf-8") == POLICY
    assert path.stat().st_ino == inode
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


def test_apply_to_a_read_only_policy_that_already_holds_the_interval(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(POLICY, encoding="utf-8")
    path.chmod(0o444)
    applied = apply_interval(path, 1000)
    assert not applied.changed
    with pytest.raises(UsageError, match="is read-only"):
        apply_interval(path, 2000)
    path.chmod(0o644)
    assert apply_interval(path, 2000).changed


def test_apply_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "p.toml"
    os.mkfifo(fifo)
    done = threading.Event()

    def rescue() -> None:  # a regression fails the test instead of hanging it
        if not done.wait(5.0):
            fifo.write_text(POLICY, encoding="utf-8")

    thread = threading.Thread(target=rescue, daemon=True)
    thread.start()
    try:
        with pytest.raises(UsageError, match=r"cannot be read: is not a regular file \(it is a FIFO\)"):
            apply_interval(fifo, 10)
    finally:
        done.set()
        thread.join()

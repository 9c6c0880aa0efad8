"""``--from-run`` (and ``report``'s RUN_DIR) given a path that exists but is no run: each says
what the path is, exits 2, and never blocks on a FIFO nor reads a device without end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support.otheruser import skip_unless_nobody_can_import

ROOT = Path(__file__).resolve().parents[2]
CPU_LOG = ROOT / "tests/tuning/data/cpu-demo-events.jsonl"
FIX = "  fix: give a run directory (<checkpoint dir>/<run id>) or one of the events-node<N>.jsonl files in it"


def nvtrain(*args: str) -> subprocess.CompletedProcess[str]:
    """``nvtrain ARGS`` in a process of its own: a command that blocked would fail the test here
    (``TimeoutExpired``) instead of hanging it."""
    return subprocess.run(
        [sys.executable, "-m", "nvtrain", *args], capture_output=True, text=True, timeout=60, check=False
    )


def from_run(path: Path) -> subprocess.CompletedProcess[str]:
    return nvtrain("tune-interval", "--from-run", str(path), "--mtbf", "6h")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_device_is_named_as_one_and_never_read() -> None:
    result = from_run(Path("/dev/zero"))
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "nvtrain: error: --from-run: /dev/zero is not a run directory nor an events log: it is a "
        "character device, which is not read (it could block or never end)\n" + FIX + "\n"
    )
    report = nvtrain("report", "/dev/zero")
    assert (
        report.returncode == 2
        and "RUN_DIR: /dev/zero is not a run directory nor an events log" in report.stderr
    )


def test_a_fifo_is_named_as_one_and_never_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "events-node0.jsonl"
    os.mkfifo(fifo)  # no writer: opening it to read would wait forever
    result = from_run(fifo)
    assert result.returncode == 2, result.stderr
    assert f"--from-run: {fifo} is not a run directory nor an events log: it is a FIFO" in result.stderr
    # in a run directory a FIFO is no pod's log: the folder has none
    in_folder = from_run(tmp_path)
    assert in_folder.returncode == 2
    assert f"--from-run: {tmp_path} has no events log (events-node<N>.jsonl)" in in_folder.stderr


def test_a_folder_without_events_logs_and_a_missing_path(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a log\n", encoding="utf-8")
    result = from_run(tmp_path)
    assert result.returncode == 2 and f"{tmp_path} has no events log" in result.stderr
    missing = from_run(tmp_path / "missing")
    assert missing.returncode == 2 and f"{tmp_path / 'missing'} does not exist" in missing.stderr


def test_an_unreadable_log_says_so() -> None:
    """As root (CI), read by the user nobody: root reads every file whatever its mode."""
    folder = Path(tempfile.mkdtemp(prefix="nvt-unreadable-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        log = folder / "events-node0.jsonl"
        shutil.copy(CPU_LOG, log)
        log.chmod(0)
        if os.geteuid() == 0 and shutil.which("setpriv") is None:
            pytest.skip("needs setpriv (util-linux) to read as another user")
        if os.geteuid() == 0:
            skip_unless_nobody_can_import("nvtrain.cli")

        def as_reader(*argv: str) -> subprocess.CompletedProcess[str]:
            if os.geteuid() != 0:
                return nvtrain(*argv)
            nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            return subprocess.run(
                [*nobody, sys.executable, "-m", "nvtrain", *argv],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                cwd=folder,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(folder)},
            )

        result = as_reader("tune-interval", "--from-run", str(log), "--mtbf", "6h")
        assert result.returncode == 2, result.stderr
        assert f"--from-run: {log} cannot be read (Permission denied)" in result.stderr
        report = as_reader("report", str(log))
        assert report.returncode == 2, report.stderr
        assert f"RUN_DIR: {log} cannot be read (Permission denied)" in report.stderr
    finally:
        shutil.rmtree(folder, ignore_errors=True)

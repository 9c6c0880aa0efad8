"""A full checkpoint volume (where the run's ``events.jsonl`` lives) never stops supervision.

A 2 MiB tmpfs stands for the volume: the test fills it while the run goes on (a file of zeros,
then the last page of the events log with blank lines, which readers skip), and frees it again.
A failed event write is reported once, the events are dropped meanwhile, and the thread that
reads ft_launcher's output goes on: if it died, ft_launcher and the workers would block on the
full pipe and ``nvtrain run`` would never exit. Mounting needs root (or CAP_SYS_ADMIN); the tests
are skipped, saying so, where that is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from nvtrain.config.schema import Policy
from nvtrain.events import Event, EventLog
from nvtrain.events.records import EventsLogError, LauncherOutputError
from nvtrain.launcher.identity import identify
from nvtrain.launcher.plan import LaunchPlan
from nvtrain.launcher.process import Child
from nvtrain.launcher.supervisor import Launcher, Supervisor
from support.proc_helpers import BIN, Mount, NvtrainRunner, make_policy, read_events, write_policy

pytestmark = pytest.mark.slow

LINES = 2000  # per rank, ~100 bytes each: several times what a pipe holds (64 KiB)


@pytest.fixture
def volume(mount: Mount) -> Path:
    """A 2 MiB tmpfs for the test's duration."""
    return mount("2m")


def _write_until_full(path: Path, chunk: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, chunk)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def fill(volume: Path, events: Path | None = None) -> None:
    """Leave no byte free on ``volume``: a file of zeros, then the last page of ``events``."""
    _write_until_full(volume / "filler", bytes(1 << 16))
    if events is not None:
        _write_until_full(events, b"\n" * 512)


def test_a_full_events_volume_does_not_stop_the_run(
    nvtrain: NvtrainRunner, tmp_path: Path, volume: Path
) -> None:
    sync = tmp_path / "sync"
    sync.mkdir()
    _, tables = make_policy(
        tmp_path,
        script=str(BIN / "flood_worker.py"),
        args=["--sync", str(sync), "--lines", str(LINES)],
        max_restarts=2,
    )
    tables["checkpoint"]["dir"] = str(volume / "ckpt")
    policy = write_policy(tmp_path, tables)
    events = volume / "ckpt" / "full-1" / "events-node0.jsonl"

    run = nvtrain.start("--run-id", "full-1", str(policy))
    run.wait_for_stdout(r"WORKER START rank=\d restart=0", count=2, timeout=90)
    fill(volume, events)
    # Rank 1 fails: nvtrain records worker_failed, restart_begin, ... on the full volume.
    (sync / "go").touch()
    # The restarted workers' output, far more than the pipe holds, still comes through while
    # the volume is full.
    run.wait_for_stdout(r"WORKER FLOODED rank=\d", count=2, timeout=90)
    errors = [line for line in run.stderr.splitlines() if "events_log_error" in line]
    assert len(errors) == 1, run.describe()
    assert str(events) in errors[0] and "No space left on device" in errors[0], errors

    (volume / "filler").unlink()  # space comes back
    (sync / "freed").touch()
    assert run.wait(timeout=90) == 0, run.describe()

    out, err = run.stdout, run.stderr
    for rank in (0, 1):
        assert len(re.findall(rf"WORKER LINE rank={rank} n=\d+ ", out)) == LINES, run.describe()
        assert f"WORKER DONE rank={rank} restart=1" in out, run.describe()
    assert "Traceback" not in err and "Exception in thread" not in err, run.describe()
    assert [line for line in err.splitlines() if "events_log_error" in line] == errors  # once
    resumed = [line for line in err.splitlines() if "events_log_resumed" in line]
    assert len(resumed) == 1 and re.search(r"dropped=[1-9]", resumed[0]), run.describe()
    recorded = read_events(events)
    assert recorded[-1]["event"] == "launcher_exit" and recorded[-1]["exit_code"] == 0, recorded[-3:]


# ft_launcher's stand-in: prints argv[1] lines; every tenth is a worker failure line of NVRx 0.4.1.
_LAUNCHER_LIKE = """
import sys
for i in range(int(sys.argv[1])):
    if i % 10 == 0:
        print(f"[2026-11-29 10:24:14,414] [ERROR] [ft_launcher9527@vm] failed (exitcode: 3) "
              f"local_rank: 1 (pid: {100000 + i}) of binary: /usr/bin/python")
    else:
        print(f"line {i} " + "x" * 100)
"""


class _StandInSupervisor(Supervisor):
    """The real supervisor, running ft_launcher's stand-in (a real child process); a test
    process has no leftovers of the run to stop, and must not stop its other children."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.children: list[Child] = []

    def start_launcher(self) -> Launcher:
        child = super().start_launcher()
        assert isinstance(child, Child)
        self.children.append(child)
        return child

    def kill_leftovers(self) -> list[int]:
        return []

    def close(self) -> None:
        """Close what ``nvtrain run`` leaves to its exit: the pipes, the guards' exit status."""
        for child in self.children:
            assert child.popen.stdout is not None and child.popen.stderr is not None
            child.popen.stdout.close()
            child.popen.stderr.close()
            if child.guard is not None:
                child.guard.wait(timeout=30)


def test_the_reader_outlives_a_full_volume(tmp_path: Path, volume: Path) -> None:
    # ft_launcher's stand-in writes far more than a pipe holds; every event write and every
    # echo (nvtrain's stdout redirected to a file on the same volume) fails.
    fill(volume)
    reported: list[Event] = []
    policy = Policy.model_validate(
        {"job": {"name": "t", "script": "train.py"}, "restart": {"escalate_after": 1000}}
    )
    identity = identify(policy, {"NVTRAIN_RUN_ID": "run-1"}, hostname="t-0")
    plan = LaunchPlan(
        argv=[sys.executable, "-c", _LAUNCHER_LIKE, "5000"],
        env={},
        endpoint="127.0.0.1:29500",
        is_host=True,
        wait_for=None,
        stop_timeout=5.0,
    )
    events = EventLog(volume / "events.jsonl", node=0, run_id="run-1", source="launcher")
    out = (volume / "echo.txt").open("w", encoding="utf-8")
    supervisor = _StandInSupervisor(
        plan, policy, identity, events, env=os.environ, report=reported.append, out=out
    )
    events.report = supervisor.events_log_report
    try:
        outcome = supervisor.run()  # never returns if the reader died: the stand-in blocks
    finally:
        supervisor.close()
        with contextlib.suppress(OSError):  # its buffer cannot be written either
            out.close()
    assert outcome.exit_code == 0
    assert len(supervisor.watch.failures) == 500  # every failure line was still read and watched
    names = [record.name for record in reported]
    assert names.count("events_log_error") == 1, names[:5]
    assert names.count("launcher_output_error") == 1, names[:5]
    [error] = [r for r in reported if isinstance(r, EventsLogError)]
    assert error.path == str(volume / "events.jsonl") and "No space left on device" in (error.error or "")
    [output_error] = [r for r in reported if isinstance(r, LauncherOutputError)]
    assert "echoing" in (output_error.error or "")
    # launcher_start, launcher_started, the 500 failures, launcher_exit
    assert events.dropped == 503

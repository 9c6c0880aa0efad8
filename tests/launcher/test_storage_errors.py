"""A full or read-only checkpoint volume, at start and during the run.

At start, ``nvtrain run`` refuses with exit 2 (the key, the path, the errno's text, the fix) and
leaves nothing in $TMPDIR. During the run, a checkpoint save that fails for a storage error is
dropped (never committed, its partial folder removed), reported once (a ``checkpoint_failed``
event and one line on stderr), and training goes on; the next save is tried again. A small tmpfs
stands for the volume: filled with a file of zeros, remounted read-only, freed again. Mounting
needs root (or CAP_SYS_ADMIN); the tests are skipped, saying so, where that is refused.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.events import EventLog
from nvtrain.events.records import Step
from nvtrain.launcher.rundir import RunPaths, write_state
from support.proc_helpers import Mount, NvtrainRunner, make_policy, read_events, write_policy

# The Checkpointer tests import torch here: its pynvml shim warns on import, and
# torch.distributed.checkpoint warns on every save and load without a process group.
pytestmark = [
    pytest.mark.filterwarnings("ignore:The pynvml package is deprecated:FutureWarning"),
    pytest.mark.filterwarnings(
        "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
    ),
]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def read_only(volume: Path, on: bool = True) -> None:
    done = _run("mount", "-o", f"remount,{'ro' if on else 'rw'}", str(volume))
    assert done.returncode == 0, done.stderr


def fill(volume: Path, leave: int = 0) -> Path:
    """Fill ``volume`` with a file of zeros, leaving about ``leave`` bytes free; returns it."""
    filler = volume / "filler"
    stat = os.statvfs(volume)
    size = max(stat.f_bavail * stat.f_frsize - leave, 0)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        chunk = bytes(1 << 16)
        while size > 0:
            try:
                size -= os.write(fd, chunk[: min(size, len(chunk))])
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
    finally:
        os.close(fd)
    return filler


# -- at start ---------------------------------------------------------------------------------


def _start_policy(tmp_path: Path, checkpoint_dir: Path) -> Path:
    _, tables = make_policy(tmp_path, module="nvtrain.demo", max_restarts=0)
    tables["checkpoint"]["dir"] = str(checkpoint_dir)
    return write_policy(tmp_path, tables)


@pytest.mark.parametrize(
    ("problem", "text", "fix"),
    [
        ("full", "No space left on device (ENOSPC)", "free space on that volume"),
        ("read-only", "Read-only file system (EROFS)", "mount the checkpoint volume read-write"),
    ],
)
def test_an_unwritable_volume_at_start_is_exit_2_and_leaves_nothing(
    nvtrain: NvtrainRunner, tmp_path: Path, mount: Mount, problem: str, text: str, fix: str
) -> None:
    volume = mount("2m")
    (volume / "ckpt").mkdir()
    if problem == "full":
        fill(volume)
    else:
        read_only(volume)
    policy = _start_policy(tmp_path, volume / "ckpt")

    run = nvtrain.start("--run-id", "start-1", str(policy))
    assert run.wait(timeout=60) == 2, run.describe()
    err = run.stderr
    assert f'[checkpoint] dir = "{volume / "ckpt"}"' in err, err
    assert f"cannot write the run's folder {volume / 'ckpt' / 'start-1'}: {text}" in err, err
    assert f"fix: {fix}" in err, err
    assert "Traceback" not in err + run.stdout, run.describe()
    assert not run.launcher_seen(), run.describe()
    assert list(nvtrain.tmpdir.iterdir()) == []  # no nvtrain-start-1-node0-<pid> state folder
    assert list((volume / "ckpt").iterdir()) == []  # nor the run's folder


def test_a_full_tmpdir_at_start_is_a_usage_error_and_leaves_no_state_folder(
    tmp_path: Path, mount: Mount
) -> None:
    tmpdir = mount("1m")
    fill(tmpdir)
    policy = Policy.model_validate(
        {"job": {"name": "t", "script": "train.py"}, "checkpoint": {"dir": str(tmp_path / "ckpt")}}
    )
    state = tmpdir / "nvtrain-run-1-node0-123"
    paths = RunPaths(
        tmp_path / "ckpt" / "run-1", tmp_path / "ckpt" / "run-1" / "events.jsonl", state, state / "p.json"
    )
    with pytest.raises(UsageError, match=r"\$TMPDIR: No space left on device \(ENOSPC\)") as raised:
        write_state(policy, paths)
    assert "TMPDIR" in raised.value.fix
    assert sorted(p.name for p in tmpdir.iterdir()) == ["filler"]


# -- during the run: the worker library ----------------------------------------------------------


def _model(seed: int) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train(model: Any, optimizer: Any, seed: int) -> None:
    import torch

    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(seed))
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()


def _bits(model: Any) -> dict[str, bytes]:
    return {k: v.detach().contiguous().numpy().tobytes() for k, v in model.state_dict().items()}


def _checkpointer(run_dir: Path, model: Any, optimizer: Any, mode: str, events: EventLog | None) -> Any:
    from nvtrain.config.schema import Checkpoint
    from nvtrain.worker import Checkpointer

    policy = Checkpoint.model_validate(
        {"dir": "/unused", "interval": 10, "async": mode == "async", "keep": 2}
    )
    return Checkpointer(model=model, optimizer=optimizer, run_dir=run_dir, policy=policy, events=events)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("problem", "text", "code"),
    [("full", "No space left on device", "ENOSPC"), ("read-only", "Read-only file system", "EROFS")],
)
def test_a_failed_save_is_dropped_reported_and_the_next_one_commits(
    tmp_path: Path,
    mount: Mount,
    capfd: pytest.CaptureFixture[str],
    mode: str,
    problem: str,
    text: str,
    code: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import nvtrain.worker.checkpoint.staging as checkpoint
    from nvtrain.worker import committed_steps

    monkeypatch.setattr(checkpoint, "_IN_MEMORY", {})  # no staged copies of other tests' saves
    volume = mount("2m")
    run_dir, log = volume / "run", tmp_path / "events.jsonl"  # the events log stays writable here
    model, optimizer = _model(0)
    ckpt = _checkpointer(run_dir, model, optimizer, mode, EventLog(log, run_id="unit", source="test"))
    assert ckpt.restore() == 0
    filler = volume / "filler"
    for step in range(1, 41):
        _train(model, optimizer, step)
        if step == 15:  # the volume fails between two saves; step 10's save is committed
            ckpt.wait()
            fill(volume) if problem == "full" else read_only(volume)
        if step == 35:  # and works again
            filler.unlink() if problem == "full" else read_only(volume, on=False)
        ckpt.maybe_save(step)  # never raises
    at_40 = _bits(model)
    ckpt.close()  # nor does this

    assert committed_steps(run_dir) == [10, 40]
    assert sorted(p.name for p in run_dir.iterdir()) == ["step-000010", "step-000040"]  # no partial
    failed = [e for e in read_events(log) if e["event"] == "checkpoint_failed"]
    assert [(e["step"], e["errno"], e["failed_in_a_row"], e["ranks"]) for e in failed] == [
        (20, code, 1, [0]),
        (30, code, 2, [0]),
    ]
    assert all(e["error"].startswith(f"{text} ({code})") for e in failed), failed
    lines = [line for line in capfd.readouterr().err.splitlines() if "not saved" in line]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"nvtrain worker rank 0: checkpoint of step 20 not saved (rank 0): {text}")
    assert "training goes on" in lines[0] and "newest checkpoint: step 10" in lines[0], lines
    assert "2 failed in a row" in lines[1], lines

    fresh_model, fresh_optimizer = _model(7)
    restorer = _checkpointer(run_dir, fresh_model, fresh_optimizer, mode, None)
    assert restorer.restore() == 40
    assert _bits(fresh_model) == at_40


def test_restore_from_a_read_only_volume_skips_what_it_cannot_move_aside(
    tmp_path: Path, mount: Mount, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nvtrain.worker.checkpoint.staging as checkpoint

    monkeypatch.setattr(checkpoint, "_IN_MEMORY", {})
    volume = mount("2m")
    run_dir, log = volume / "run", tmp_path / "events.jsonl"
    model, optimizer = _model(0)
    ckpt = _checkpointer(run_dir, model, optimizer, "sync", None)
    ckpt.save(10)
    ckpt.close()
    saved = _bits(model)
    (run_dir / "step-000020").mkdir()  # no COMMITTED: restore would move it aside
    read_only(volume)

    fresh_model, fresh_optimizer = _model(7)
    events = EventLog(log, run_id="unit", source="test")
    assert _checkpointer(run_dir, fresh_model, fresh_optimizer, "sync", events).restore() == 10
    assert _bits(fresh_model) == saved
    [rejected] = [e for e in read_events(log) if e["event"] == "checkpoint_rejected"]
    assert rejected["step"] == 20 and rejected["error"].startswith("Read-only file system (EROFS)")
    assert "moved_to" not in rejected


def test_a_worker_events_log_on_a_full_volume_reports_once_and_never_raises(
    mount: Mount, capfd: pytest.CaptureFixture[str]
) -> None:
    from nvtrain.worker.settings import load_settings

    volume = mount("1m")
    settings = load_settings({"NVTRAIN_EVENTS": str(volume / "events.jsonl"), "NVTRAIN_RUN_ID": "run-1"})
    events = settings.events(rank=0)
    assert events is not None
    events.emit(Step(step=1))
    filler = fill(volume)
    with (volume / "events.jsonl").open("ab", buffering=0) as log:  # its last page too
        with pytest.raises(OSError, match="No space left"):
            while True:
                log.write(b"\n" * 512)  # blank lines: readers skip them
    for step in range(2, 5):
        events.emit(Step(step=step))  # dropped, never raised
    filler.unlink()
    events.emit(Step(step=5))
    err = capfd.readouterr().err.splitlines()
    assert [line for line in err if "cannot write the events log" in line] == [
        f"nvtrain worker rank 0: cannot write the events log {volume / 'events.jsonl'}: No space left on "
        "device (errno 28); training goes on, its events are dropped until the log can be written again"
    ]
    assert [line for line in err if "is written again" in line] == [
        f"nvtrain worker rank 0: the events log {volume / 'events.jsonl'} is written again; 3 event(s) "
        "were dropped"
    ]
    assert [e["step"] for e in read_events(volume / "events.jsonl")] == [1, 5]


# -- during the run: a real job -------------------------------------------------------------------


@pytest.mark.slow
def test_a_demo_run_outlives_a_full_checkpoint_volume(
    nvtrain: NvtrainRunner, tmp_path: Path, mount: Mount
) -> None:
    volume = mount("32m")
    steps = 100
    # About 1.7 MB of model and optimizer state per checkpoint, saved every 10 steps of 0.1 s.
    _, tables = make_policy(
        tmp_path,
        module="nvtrain.demo",
        args=[
            "--steps",
            str(steps),
            "--width",
            "256",
            "--depth",
            "2",
            "--step-time",
            "0.1",
            "--log-every",
            "10",
        ],
        max_restarts=0,
    )
    tables["checkpoint"] = {"dir": str(volume / "ckpt"), "interval": 10, "keep": 2}
    policy = write_policy(tmp_path, tables)
    events = volume / "ckpt" / "full-run"  # the run directory: its pod's events log

    def seen(event: str) -> list[dict[str, Any]]:
        return [e for e in read_events(events) if e["event"] == event]

    def wait_for(event: str, what: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 60
        while not (found := seen(event)):
            assert run.proc.poll() is None and time.monotonic() < deadline, f"no {what}\n{run.describe()}"
            time.sleep(0.05)
        return found

    run = nvtrain.start("--run-id", "full-run", str(policy))
    wait_for("checkpoint_committed", "first commit")
    filler = fill(volume, leave=256 << 10)  # room for the events, not for a checkpoint
    [first_failure, *_] = wait_for("checkpoint_failed", "failed save")
    filler.unlink()
    assert run.wait(timeout=90) == 0, run.describe()

    out = run.stdout + run.stderr
    assert "Traceback" not in out and "Exception in thread" not in out, run.describe()
    failed = seen("checkpoint_failed")
    assert first_failure["error"].startswith("No space left on device (ENOSPC)"), failed
    assert len(failed) == len({e["step"] for e in failed}), failed  # once per save, not per rank
    said = re.findall(r"nvtrain worker rank 0: checkpoint of step (\d+) not saved", run.stderr)
    assert sorted(map(int, said)) == sorted(e["step"] for e in failed), run.describe()
    committed = [e["step"] for e in seen("checkpoint_committed")]
    assert committed[-1] == steps and committed[-1] > max(e["step"] for e in failed), committed
    assert not [p.name for p in events.iterdir() if ".partial-" in p.name]
    assert re.search(r"event=checkpoint_failed .*error=\"No space left on device", run.stderr), run.stderr

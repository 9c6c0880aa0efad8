"""Damaged checkpoints (a flipped byte, a lost ``COMMITTED``) are rejected for good: moved aside
at restore or at the next save of their step, never kept as that step's commit, never counted
by retention, and never counted by the report as the newest commit. One process, world of one,
no process group, real files and real torch (helpers shared with ``test_checkpointer.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import xxhash
from test_checkpointer import (
    _bits,
    _checkpointer,
    _committed,
    _events,
    _flip_byte,
    _model,
    _named,
    _new_process,
    _policy,
    _train,
)

from nvtrain.events import Event
from nvtrain.events.records import from_fields

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
    )
]


@pytest.fixture(autouse=True)
def _fresh_process_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import nvtrain.worker.checkpoint.staging as checkpoint

    monkeypatch.setattr(checkpoint, "_IN_MEMORY", {}, raising=False)


def _damage(folder: Path, how: str) -> None:
    if how == "flip-shard-byte":
        _flip_byte(sorted(folder.glob("*.distcp"))[0])
    else:
        assert how == "no-committed", how
        (folder / "COMMITTED").unlink()


def _rejected(run_dir: Path, step: int) -> list[Path]:
    return sorted(run_dir.glob(f"step-{step:06d}.rejected-*"))


def _restore(run_dir: Path, log: Path, seed: int = 9) -> tuple[int, dict[str, Any]]:
    """Restore into a fresh model, as a new process would; the step and the state's bits."""
    model, optimizer = _model(seed)
    step = _checkpointer(run_dir, model, optimizer, _policy(False), _events(log)).restore()
    return step, _bits(model, optimizer)


def _verified(run_dir: Path) -> list[int]:
    """Committed steps whose files all match the sizes and xxh3 digests in COMMITTED."""

    def intact(folder: Path) -> bool:
        files = json.loads((folder / "COMMITTED").read_text())["files"]
        for name, entry in files.items():
            data = (folder / name).read_bytes() if (folder / name).is_file() else None
            if data is None or entry != {"size": len(data), "xxh3": xxhash.xxh3_64_hexdigest(data)}:
                return False
        return True

    return [s for s in _committed(run_dir) if intact(run_dir / f"step-{s:06d}")]


@pytest.mark.parametrize("restore_first", [False, True], ids=["save-over", "restore-then-save"])
@pytest.mark.parametrize("how", ["flip-shard-byte", "no-committed"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_damaged_newest_checkpoint_is_replaced_by_the_next_save_of_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, how: str, restore_first: bool
) -> None:
    """Steps 10 and 20 are committed, then step 20 is damaged. A later attempt saves step 20
    again (after restoring 10, or over the damaged folder it never looked at, as a restore from
    memory would): that save becomes the commit of step 20 and the damaged folder is moved aside."""
    run_dir, log = tmp_path / "run", tmp_path / "events.jsonl"
    model, optimizer = _model(0)
    first = _checkpointer(run_dir, model, optimizer, _policy(False))
    for step in (10, 20):
        _train(model, optimizer, 1, seed=step)
        first.save(step)
    first.close()
    _damage(run_dir / "step-000020", how)
    _new_process(monkeypatch)

    second = _checkpointer(run_dir, model, optimizer, _policy(mode == "async"), _events(log))
    if restore_first:
        assert second.restore() == 10
        assert len(_rejected(run_dir, 20)) == 1  # moved aside by the restore
    _train(model, optimizer, 1, seed=99)
    second.save(20)
    second.close()
    saved = _bits(model, optimizer)

    assert _verified(run_dir) == [10, 20]  # the step 20 on storage is the new save
    assert len(_rejected(run_dir, 20)) == 1
    committed = [e for e in _named(log, "checkpoint_committed") if e["step"] == 20]
    assert len(committed) == 1, committed
    assert _named(log, "checkpoint_already_committed") == []
    (rejected,) = _named(log, "checkpoint_rejected")
    assert (rejected["step"], Path(rejected["path"]).name) == (20, "step-000020")
    assert Path(rejected["moved_to"]) == _rejected(run_dir, 20)[0]

    _new_process(monkeypatch)
    step, bits = _restore(run_dir, tmp_path / "restore.jsonl")
    assert (step, bits) == (20, saved)


def test_an_intact_commit_of_the_step_is_kept_and_not_logged_as_a_new_commit(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "events.jsonl"
    model, optimizer = _model(0)
    first = _checkpointer(run_dir, model, optimizer, _policy(False))
    first.save(10)
    first.close()
    original = (run_dir / "step-000010" / "COMMITTED").read_bytes()
    _train(model, optimizer, 1, seed=3)
    second = _checkpointer(run_dir, model, optimizer, _policy(False), _events(log))
    second.save(10)
    second.close()
    assert (run_dir / "step-000010" / "COMMITTED").read_bytes() == original
    assert sorted(p.name for p in run_dir.iterdir()) == ["step-000010"]
    assert _named(log, "checkpoint_committed") == []
    assert [e["step"] for e in _named(log, "checkpoint_already_committed")] == [10]


@pytest.mark.parametrize("how", ["flip-shard-byte", "no-committed"])
def test_keep_1_never_leaves_zero_good_checkpoints_after_the_newest_is_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The demo's case: keep = 1, run to step 60, damage it, run again from scratch. Each save
    of the second run must leave a good checkpoint on storage, and the save of step 60 must
    really be committed (the old code threw it away and then deleted step 50)."""
    run_dir, log = tmp_path / "run", tmp_path / "events.jsonl"
    model, optimizer = _model(0)
    first = _checkpointer(run_dir, model, optimizer, _policy(False, keep=1))
    for step in range(10, 70, 10):
        first.save(step)
    first.close()
    assert _committed(run_dir) == [60]
    _damage(run_dir / "step-000060", how)
    _new_process(monkeypatch)

    model, optimizer = _model(1)
    second = _checkpointer(run_dir, model, optimizer, _policy(False, keep=1), _events(log))
    assert second.restore() == 0
    aside = []
    for step in range(10, 80, 10):
        _train(model, optimizer, 1, seed=step)
        second.save(step)
        assert _verified(run_dir) == [step], f"after the save of step {step}"
        assert _committed(run_dir) == [step], f"after the save of step {step}"
        aside.append(len(_rejected(run_dir, 60)))
    second.close()
    assert aside == [1, 1, 1, 1, 1, 1, 0]  # kept to look at until a later step is committed
    assert [e["step"] for e in _named(log, "checkpoint_committed")] == [10, 20, 30, 40, 50, 60, 70]
    assert [e["step"] for e in _named(log, "checkpoint_rejected")] == [60]

    _new_process(monkeypatch)
    assert _restore(run_dir, tmp_path / "restore.jsonl") == (70, _bits(model, optimizer))


def test_retention_does_not_count_a_newer_unverified_checkpoint(tmp_path: Path) -> None:
    """keep = 2 with an older good step 10 and a newer step 30 that this run never verified
    (damaged): saving step 20 must not let step 30 push step 10 out, and step 30 is left alone
    (the save of step 30 will reject it)."""
    run_dir = tmp_path / "run"
    model, optimizer = _model(0)
    first = _checkpointer(run_dir, model, optimizer, _policy(False, keep=3))
    for step in (10, 30):
        first.save(step)
    first.close()
    _damage(run_dir / "step-000030", "flip-shard-byte")
    second = _checkpointer(run_dir, model, optimizer, _policy(False, keep=2))
    second.save(20)
    second.close()
    assert _committed(run_dir) == [10, 20, 30]
    assert _verified(run_dir) == [10, 20]


@pytest.mark.parametrize("how", ["flip-shard-byte", "no-committed"])
def test_a_damaged_newest_checkpoint_is_moved_aside_at_restore(tmp_path: Path, how: str) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "events.jsonl"
    model, optimizer = _model(0)
    saver = _checkpointer(run_dir, model, optimizer, _policy(False))
    _train(model, optimizer, 1, seed=1)
    saver.save(10)
    at_10 = _bits(model, optimizer)
    _train(model, optimizer, 1, seed=2)
    saver.save(20)
    saver.close()
    _damage(run_dir / "step-000020", how)

    assert _restore(run_dir, log) == (10, at_10)
    assert not (run_dir / "step-000020").exists()
    (aside,) = _rejected(run_dir, 20)
    assert (aside / "__0_0.distcp").is_file()  # moved, not deleted: kept to look at
    (rejected,) = _named(log, "checkpoint_rejected")
    assert (rejected["step"], rejected["moved_to"]) == (20, str(aside))
    expected = "COMMITTED" if how == "no-committed" else "does not match its manifest's digest"
    assert expected in rejected["problem"], rejected["problem"]
    # A second restore finds nothing to reject.
    assert _restore(run_dir, tmp_path / "again.jsonl") == (10, at_10)
    assert _named(tmp_path / "again.jsonl", "checkpoint_rejected") == []


# -- the report ---------------------------------------------------------------------------------


def typed(lines: list[dict[str, Any]]) -> list[Event]:
    """The records a reader of the log gets for these lines (all valid here)."""
    events = [from_fields(line) for line in lines]
    assert None not in events
    return [e for e in events if e is not None]


def _report_log(rejected: str | None) -> list[dict[str, Any]]:
    """Steps 1..25 at 1 s a step, commits of 10 and 20, a SIGKILL at 25; the restart finds step 20
    damaged (``rejected``: which events say so) and goes back to 10."""
    events: list[dict[str, Any]] = []

    def at(t: float, event: str, **fields: Any) -> None:
        events.append({"ts": 1000.0 + t, "event": event, "run_id": "r", **fields})

    at(0, "launcher_start", node=0, source="launcher")
    at(3, "attempt_start", pid=1, rank=0, world=1, iteration=0, restart_count=0)
    for t, step in ((4, 1), (13, 10), (23, 20), (28, 25)):
        at(t, "step", step=step, step_s=None if step == 1 else 1.0, pid=1, rank=0, attempt=0)
    at(15, "checkpoint_committed", step=10, pid=1, rank=0, write_s=1.0)
    at(25, "checkpoint_committed", step=20, pid=1, rank=0, write_s=1.0)
    at(29, "fault_injected", step=25, pid=1, rank=0, kind="sigkill")
    at(29.5, "worker_failed", node=0, local_rank=0, exit_code=-9, signal="SIGKILL", step=25)
    at(30, "restart_begin", layer="in_job", node=0, attempts_left=3)
    at(35, "attempt_start", pid=2, rank=0, world=1, iteration=0, restart_count=1)
    path = "/ckpt/r/step-000020"
    if rejected in ("corrupt", "both"):
        at(36, "checkpoint_corrupt", step=20, path=path, problem="a file does not match", pid=2, rank=0)
    if rejected in ("rejected", "both"):
        at(36.1, "checkpoint_rejected", step=20, path=path, moved_to=path + ".rejected-ab", pid=2, rank=0)
    at(37, "checkpoint_restored", step=10 if rejected else 20, origin="storage", seconds=1.0, pid=2, rank=0)
    first = 11 if rejected else 21
    at(38, "step", step=first, step_s=None, pid=2, rank=0, attempt=0)
    at(47, "step", step=first + 9, step_s=1.0, pid=2, rank=0, attempt=0)
    at(50, "launcher_exit", node=0, exit_code=0, cause="finished")
    return events


@pytest.mark.parametrize("rejected", ["corrupt", "rejected", "both"])
def test_the_report_does_not_count_a_rejected_checkpoint_as_the_newest_commit(rejected: str) -> None:
    from nvtrain.report import build_report

    report = build_report(typed(_report_log(rejected)), "events.jsonl")
    (incident,) = report.incidents
    assert (incident.last_step, incident.restored_step, incident.rollback_steps) == (25, 10, 15)
    assert incident.freshness_steps == 15  # step 20's checkpoint was never usable
    assert [step for _, step in report.checkpoints.commits] == [10]
    assert (report.checkpoints.committed, report.checkpoints.corrupt) == (1, 1)
    assert all(n <= 15 for _, n, _ in report.freshness)
    assert max(n for _, n, _ in report.freshness) == 15  # at the fault


def test_the_report_counts_a_commit_that_was_not_rejected() -> None:
    """The counterpart: step 20 is restored, its commit counts (freshness 5), as before."""
    from nvtrain.report import build_report

    report = build_report(typed(_report_log(None)), "events.jsonl")
    (incident,) = report.incidents
    assert (incident.restored_step, incident.freshness_steps) == (20, 5)
    assert [step for _, step in report.checkpoints.commits] == [10, 20]

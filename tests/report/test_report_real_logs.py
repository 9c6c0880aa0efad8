"""The report of real events logs: the CPU demo (`nvtrain run`), the H200 runs in benchmarks/,
and a log from before versioned events (tests/report/data/events-v0.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.events import read_events
from nvtrain.events.records import CheckpointRestored, RestartBegin, Step, WorkerThreadError
from nvtrain.report import Report, read_report
from nvtrain.tuning.measured import read_measured
from support.report_logs import CPU_LOG, GPU_LOG, MEM_FALSE_LOG, MEM_TRUE_LOG, REAL_LOGS, ROOT, V0_LOG

DATA = ROOT / "tests/report/data"


def test_the_cpu_demo() -> None:
    """2 ranks: an exception at step 50 (in-process, back to 40), a SIGKILL at 90 (in-job, back to 80)."""
    r = read_report(CPU_LOG)
    assert (r.run_id, r.nodes, r.ranks, r.exit_code, r.final_step) == ("demo3", 1, 2, 0, 120)
    assert [(i.layer, i.cause, i.last_step, i.restored_step, i.rollback_steps) for i in r.incidents] == [
        ("in_process", "exception (injected)", 50, 40, 10),
        ("in_job", "sigkill (injected)", 90, 80, 10),
    ]
    assert (r.kept_steps, r.executed_steps, r.lost_steps) == (120, 140, 20)
    assert r.time.total == pytest.approx(63.570, abs=1e-3)
    assert r.training_goodput == pytest.approx(0.148, abs=0.002)
    assert r.infrastructure_goodput == pytest.approx(0.181, abs=0.002)
    in_process, in_job = r.incidents
    assert in_process.phases["rendezvous"] is None and in_job.phases["teardown"] is None
    assert in_job.phases["start"] == pytest.approx(10.39, abs=0.01)  # new worker processes
    assert r.checkpoints.saves == 6 and r.checkpoints.committed == 6
    assert r.restarts_by_layer == {"in_process": 1, "in_job": 1} and r.failed_attempts == 0
    assert r.notes == ()


def test_the_gpu_demo_rolls_back_past_partial_saves() -> None:
    r = read_report(GPU_LOG)
    assert [i.layer for i in r.incidents] == ["in_process", "in_process", "in_job"]
    # faults at steps 25, 45, 65 while the save of 20, 40, 60 was still being written
    assert [(i.last_step, i.restored_step) for i in r.incidents] == [(25, 10), (45, 30), (65, 50)]
    assert r.checkpoints.partial == 3 and r.checkpoints.saves == 11 and r.checkpoints.committed == 8
    assert r.checkpoints.waited is not None and r.checkpoints.waited.count == 7


def test_in_memory_restores_are_faster_than_storage() -> None:
    memory, storage = read_report(MEM_TRUE_LOG), read_report(MEM_FALSE_LOG)
    assert [i.restore_source for i in memory.incidents[:2]] == ["memory", "memory"]
    assert [i.restore_source for i in storage.incidents[:2]] == ["storage", "storage"]
    for fast, slow in zip(memory.incidents[:2], storage.incidents[:2], strict=True):
        assert fast.phases["restore"] is not None and slow.phases["restore"] is not None
        assert fast.phases["restore"] < slow.phases["restore"]
    # The in-memory run ends with an in-process restart that no fault explains, after its last step.
    last = memory.incidents[-1]
    assert (last.cause, last.recovered, last.rollback_steps) == ("no fault logged", False, 0)


@pytest.mark.parametrize("path", REAL_LOGS, ids=lambda p: Path(p).name)
def test_invariants_of_every_real_log(path: Path) -> None:
    r = read_report(path)
    t = r.time
    assert t.startup is not None and t.up is not None and t.shutdown is not None
    assert t.startup + t.up + t.recovering + t.shutdown == pytest.approx(t.total, abs=1e-6)
    assert r.training_goodput is not None and r.infrastructure_goodput is not None
    assert 0 < r.training_goodput <= (r.training_goodput_with_replays or 0) <= r.infrastructure_goodput < 1
    for incident in r.incidents:
        present = [v for v in incident.phases.values() if v is not None]
        assert all(v >= 0 for v in present)
        if incident.seconds is not None:
            assert sum(present) == pytest.approx(incident.seconds)
        assert incident.freshness_steps == incident.rollback_steps  # restored = newest committed
    _same_recoveries_as_tune_interval(r, path)


def _same_recoveries_as_tune_interval(r: Report, path: Path) -> None:
    """The report groups faults as `tune-interval --from-run` does (both use nvtrain.runlog)."""
    measured = read_measured(path)
    recovered = [i for i in r.incidents if i.recovered]
    assert [i.layer for i in recovered] == [m.layer for m in measured.recoveries]
    assert [i.seconds for i in recovered] == pytest.approx([m.seconds for m in measured.recoveries])


# -- a log from before versioned events ---------------------------------------------------------


def test_a_log_without_versions_reads_as_version_0() -> None:
    """`nvtrain run` of the demo (2 ranks, exception at step 25, SIGKILL at 45), written before
    events carried `v`: every line is a valid event of version 0, typed as today's records."""
    assert '"v":' not in V0_LOG.read_text(encoding="utf-8")
    events = read_events(V0_LOG)
    assert events.skipped == 0 and len(events) == 83
    assert {e.v for e in events} == {0}
    steps = [e for e in events if isinstance(e, Step)]
    assert len(steps) == 21 and sum(e.first_of_attempt for e in steps) == 6  # 3 attempts x 2 ranks
    assert {e.origin for e in events if isinstance(e, CheckpointRestored)} == {"memory", "storage"}
    begins = [e for e in events if isinstance(e, RestartBegin)]
    assert [e.layer for e in begins] == ["in_process", "in_process", "in_job"]
    assert any(isinstance(e, WorkerThreadError) for e in events)


def _close(got: Any, want: Any, where: str = "") -> None:
    """``got`` equals ``want``, numbers to 1e-9 relative."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            _close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _close(a, b, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), where
    else:
        assert got == want, where


def test_the_v0_log_gives_the_figures_it_gave_before_typed_events() -> None:
    """`report --json` and `tune-interval --from-run --json` of the v0 log, as the dict-based
    readers computed them before events were typed records (recorded in tests/report/data)."""
    runner = CliRunner()
    report = runner.invoke(app, ["report", str(V0_LOG), "--json", "--no-timeline"])
    assert report.exit_code == 0, report.output
    data = json.loads(report.stdout)
    assert data.pop("source") == str(V0_LOG)
    _close(data, json.loads((DATA / "events-v0.report.json").read_text(encoding="utf-8")))

    tuned = runner.invoke(app, ["tune-interval", "--from-run", str(V0_LOG), "--mtbf", "6h", "--json"])
    assert tuned.exit_code == 0, tuned.output
    data = json.loads(tuned.stdout)
    assert data.pop("events") == str(V0_LOG)
    _close(data, json.loads((DATA / "events-v0.tune-interval.json").read_text(encoding="utf-8")))


def test_the_v0_log_in_figures() -> None:
    r = read_report(V0_LOG)
    assert (r.run_id, r.nodes, r.ranks, r.exit_code, r.final_step) == ("events-v0", 1, 2, 0, 60)
    assert [(i.layer, i.cause, i.last_step, i.restored_step, i.restore_source) for i in r.incidents] == [
        ("in_process", "exception (injected)", 25, 20, "memory"),
        ("in_job", "sigkill (injected)", 45, 40, "storage"),
    ]
    assert (r.kept_steps, r.executed_steps, r.lost_steps) == (60, 70, 10)
    assert r.checkpoints.finished_at_faults == 2 and r.notes == ()
    measured = read_measured(V0_LOG)
    assert [(m.layer, m.step) for m in measured.recoveries] == [("in_process", 25), ("in_job", 45)]
    assert measured.restore_from == "storage" and measured.counts["save_block"] == 12

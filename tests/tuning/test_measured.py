"""Measured timings from events logs: synthetic logs with known answers, and real ones."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from nvtrain.config.timings import Timings, read_timings
from nvtrain.errors import UsageError
from nvtrain.events.records import Event, from_fields
from nvtrain.runlog import log_files
from nvtrain.tuning.advise import Request, Tuned, tune_interval
from nvtrain.tuning.measured import OriginLoads, measure_events, read_measured

DATA = Path(__file__).resolve().parent / "data"
CPU_LOG = DATA / "cpu-demo-events.jsonl"  # `nvtrain run` of the built-in demo job (CPU, 2 ranks)
GPU_LOG = Path(__file__).resolve().parents[2] / "benchmarks/checkpoint/results/h200-gpu-demo-events.jsonl"


class Log:
    """Builds an events log the way the launcher and the workers write it."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.t = 1000.0

    def at(self, dt: float, event: str, **fields: Any) -> Log:
        self.t += dt
        self.events.append({"ts": self.t, "event": event, **fields})
        return self

    def step(
        self, step: int, step_s: float | None, *, pid: int = 1, attempt: int = 0, restarts: int = 0
    ) -> Log:
        return self.at(0.1, "step", step=step, step_s=step_s, rank=pid - 1, pid=pid, attempt=attempt,
                       restart_count=restarts)  # fmt: skip

    def save(self, step: int, *, blocked: float, waited: float = 0.0, pid: int = 1) -> Log:
        self.at(0.0, "checkpoint_begin", step=step, pid=pid, waited_for_previous_s=waited)
        return self.at(blocked, "checkpoint_staged", step=step, pid=pid, blocked_s=blocked, bytes=10)

    def records(self) -> list[Event]:
        """The events as ``read_events`` gives them: typed records (each one must be valid)."""
        records = [from_fields(e) for e in self.events]
        assert None not in records, self.events
        return [r for r in records if r is not None]

    def write(self, path: Path) -> Path:
        path.write_text("".join(json.dumps(e) + "\n" for e in self.events), encoding="utf-8")
        return path


def two_rank_run() -> Log:
    log = Log()
    for pid in (1, 2):
        log.step(1, None, pid=pid)
    for pid, took in ((1, 0.5), (2, 0.7)):
        log.step(10, took, pid=pid)
    for pid, blocked in ((1, 0.2), (2, 0.4)):
        log.save(10, blocked=blocked, pid=pid)
    log.step(11, 3.0, pid=1)  # includes the save's blocking: left out
    log.at(1.0, "checkpoint_committed", step=10, pid=1, write_s=5.0)
    log.save(20, blocked=1.25, waited=1.0, pid=1)  # waited 1 s for the previous write
    log.at(2.0, "checkpoint_committed", step=20, pid=1, write_s=7.0)
    # in-process restart: fault, detection, new attempt in the same processes
    log.at(1.0, "fault_injected", step=25, rank=1, pid=2, kind="exception")
    log.at(2.0, "restart_begin", layer="in_process", rank=1, pid=2)
    log.at(1.0, "checkpoint_restored", step=20, seconds=0.5, source="memory", pid=1)
    log.step(21, None, pid=1, attempt=1)
    log.step(21, None, pid=2, attempt=1)
    log.step(30, 0.6, pid=1, attempt=1)
    # in-job restart: the launcher sees a worker die, new processes load from storage
    log.at(1.0, "fault_injected", step=35, rank=0, pid=1, kind="sigkill")
    log.at(0.5, "worker_failed", local_rank=0, exit_code=-9, pid=99)
    log.at(0.0, "restart_begin", layer="in_job", pid=99)
    log.at(8.0, "checkpoint_restored", step=20, seconds=2.0, source="storage", pid=3)
    log.at(0.1, "checkpoint_restored", step=20, seconds=2.5, source="storage", pid=4)
    log.step(21, None, pid=3, restarts=1)
    return log


def test_measures_of_a_synthetic_log() -> None:
    measured = measure_events(two_rank_run().records(), "log")
    t = measured.timings
    assert t.step is not None and t.step.median == pytest.approx(0.6) and measured.counts["step"] == 3
    assert t.step.max == pytest.approx(0.7)  # step 11 (after a save) is not a sample
    assert t.save_block is not None and measured.counts["save_block"] == 3
    assert sorted([0.2, 0.4, 0.25])[1] == pytest.approx(t.save_block.median)  # 1.25 s less the 1 s wait
    assert t.save_write is not None and t.save_write.median == pytest.approx(6.0)
    assert t.restore is not None and t.restore.median == pytest.approx(2.25)
    assert measured.restore_from == "storage"
    assert measured.waits == (1.0,)
    layers = [(r.layer, r.step) for r in measured.recoveries]
    assert layers == [("in_process", 25), ("in_job", 35)]
    in_process, in_job = measured.recoveries
    assert in_process.seconds == pytest.approx(3.1)  # fault -> first step of the next attempt
    assert in_process.restore_s == pytest.approx(0.5)
    assert in_job.seconds == pytest.approx(8.7) and in_job.restore_s == pytest.approx(2.5)
    assert t.restart_in_process is not None and t.restart_in_job is not None
    restart = measured.restart("in_job")
    assert restart is not None and restart[0] == pytest.approx(6.2) and restart[1] == 1
    assert measured.counts == {
        "step": 3,
        "save_block": 3,
        "save_write": 2,
        "restore": 2,
        "restart_in_process": 1,
        "restart_in_job": 1,
    }


def test_in_job_is_told_from_a_higher_restart_count_alone() -> None:
    log = Log().step(1, None).step(10, 1.0).at(1.0, "fault_injected", step=12, pid=1, kind="sigkill")
    log.step(11, None, pid=5, restarts=1)
    assert [r.layer for r in measure_events(log.records(), "x").recoveries] == ["in_job"]


def test_memory_loads_count_when_no_load_read_storage() -> None:
    log = Log().at(1, "checkpoint_restored", seconds=0.1, source="memory")
    measured = measure_events(log.records(), "x")
    assert measured.restore_from == "memory" and measured.counts["restore"] == 1


def test_junk_is_ignored() -> None:
    junk: list[dict[str, Any]] = [{"event": "step"}, {"ts": "x", "event": "step"}]
    assert [from_fields(e) for e in junk] == [None, None]  # not events: the reader skips them
    negative = from_fields({"ts": 1.0, "event": "step", "step_s": -1, "step": 3})
    assert negative is not None
    measured = measure_events([negative], "x")  # a negative duration is no sample
    assert measured.timings == Timings()
    assert not measured.recoveries


def test_missing_data_names_the_file_and_what_is_missing(tmp_path: Path) -> None:
    path = Log().at(0, "launcher_start").step(1, None).write(tmp_path / "events.jsonl")
    measured = read_measured(tmp_path)
    with pytest.raises(UsageError) as caught:
        measured.require(["step", "save_block", "save_write"])
    message = caught.value.message
    assert str(path) in message
    assert "step timings" in message and "checkpoint saves" in message and "committed checkpoints" in message
    assert "--step-time" in caught.value.fix and "--save-write" in caught.value.fix
    measured.require([])  # nothing asked, nothing missing


def test_unusable_paths(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="has no events log"):
        log_files(tmp_path)
    with pytest.raises(UsageError, match="does not exist"):
        log_files(tmp_path / "nope.jsonl")
    (tmp_path / "events.jsonl").write_text("not json\n{also not\n", encoding="utf-8")
    with pytest.raises(UsageError, match="holds no events"):
        read_measured(tmp_path)


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = two_rank_run().write(tmp_path / "events.jsonl")
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"ts": 2000, "event": "step", "step_s": 99')
    assert read_measured(path).timings.step.max == pytest.approx(0.7)  # type: ignore[union-attr]


def test_the_cpu_demo_log() -> None:
    """The built-in demo job on CPU: an exception at step 50 (in-process), a SIGKILL at 90 (in-job)."""
    measured = read_measured(CPU_LOG)
    t = measured.timings
    assert t.step is not None and 0.01 < t.step.median < 1.0
    assert t.save_block is not None and t.save_write is not None and t.restore is not None
    assert [(r.layer, r.step) for r in measured.recoveries] == [("in_process", 50), ("in_job", 90)]
    in_process, in_job = (r.seconds for r in measured.recoveries)
    assert 1.0 < in_process < in_job < 60.0
    assert measured.counts["save_block"] == 12 and measured.counts["save_write"] == 6


def test_the_gpu_demo_log_shows_saves_waiting_for_the_previous_write() -> None:
    measured = read_measured(GPU_LOG)
    assert [r.layer for r in measured.recoveries] == ["in_process", "in_process", "in_job"]
    assert len(measured.waits) == 7  # interval 10 at ~2 ms steps: every save waited
    t = measured.timings
    assert t.save_block is not None and t.save_block.median < 0.05  # staging alone, waits left out


def test_measured_timings_are_a_valid_timings_file(tmp_path: Path) -> None:
    """The shared format: what --from-run measures, `validate --timings` reads back."""
    timings = read_measured(CPU_LOG).timings
    path = tmp_path / "timings.json"
    path.write_text(timings.model_dump_json(exclude_none=True), encoding="utf-8")
    parsed = read_timings(path)
    assert parsed.findings == [] and parsed.model == timings


def test_hangs_and_pod_restarts_are_measured_as_the_report_groups_them() -> None:
    """A hang the launcher detected (nothing injected) counts from its detection, not from the
    kill that followed; a pod stopped and started again is a recovery in new processes. Both
    commands group the log through ``nvtrain.runlog``, so tune-interval measures what the report
    shows."""
    from nvtrain.report import build_report

    log = Log().at(0, "launcher_start", node=0).step(1, None).step(10, 1.0)
    log.at(10, "hang_detected", node=0, local_rank=0, heartbeat="subsequent")
    log.at(10, "worker_failed", node=0, local_rank=0, exit_code=-9, signal="SIGKILL")
    log.at(0.5, "restart_begin", layer="in_job", node=0, attempts_left=2)
    log.step(11, None, pid=2, restarts=1)
    log.at(5, "signal", node=0, signal="SIGTERM").at(1, "launcher_exit", node=0, exit_code=143)
    log.at(20, "launcher_start", node=0).step(11, None, pid=3)  # a new pod: restart_count 0 again
    measured = measure_events(log.records(), "x")
    assert [(r.layer, r.cause) for r in measured.recoveries] == [("in_job", "hang"), ("in_job", "SIGTERM")]
    assert [r.seconds for r in measured.recoveries] == pytest.approx([10.6, 21.1])
    assert measured.counts["restart_in_job"] == 2 and measured.counts["restart_in_process"] == 0
    report = build_report(log.records(), "x")
    assert [(i.layer, i.seconds) for i in report.incidents] == [
        ("in_job", pytest.approx(10.6)),
        ("pod", pytest.approx(21.1)),
    ]


# -- the load per recovery: each origin's median, weighted by the recoveries that loaded from it --


def recovery(log: Log, *, origin: str, seconds: tuple[float, float], restarts: int) -> Log:
    """A worker killed and replaced (a new process); both ranks load from ``origin``."""
    log.at(1.0, "fault_injected", step=25, rank=0, pid=1, kind="sigkill")
    log.at(0.5, "worker_failed", local_rank=0, exit_code=-9, signal="SIGKILL", pid=99)
    log.at(0.0, "restart_begin", layer="in_job", pid=99)
    for pid, took in zip((1, 2), seconds, strict=True):
        log.at(took, "checkpoint_restored", step=20, seconds=took, origin=origin, pid=pid)
    log.step(21, None, pid=1, restarts=restarts)
    return log.step(30, 0.5, pid=1, restarts=restarts)


def mixed_run() -> Log:
    """A first start that loads from storage (no fault before it), then three recoveries: two
    load from host memory, one (a damaged copy, or a lost pod) from storage."""
    log = Log().at(1.0, "checkpoint_restored", step=10, seconds=3.0, origin="storage", pid=1)
    log.step(11, None).step(20, 0.5)
    recovery(log, origin="memory", seconds=(0.1, 0.2), restarts=1)
    recovery(log, origin="storage", seconds=(2.0, 2.4), restarts=2)
    return recovery(log, origin="memory", seconds=(0.1, 0.2), restarts=3)


def test_each_origin_is_measured_and_weighted_by_its_recoveries() -> None:
    measured = measure_events(mixed_run().records(), "x")
    memory, storage = measured.by_origin["memory"], measured.by_origin["storage"]
    assert (memory.loads, memory.recoveries) == (4, 2) and memory.median == pytest.approx(0.15)
    assert (storage.loads, storage.recoveries) == (3, 1) and storage.median == pytest.approx(2.4)
    assert measured.restore_per_recovery() == pytest.approx((2 * 0.15 + 2.4) / 3)
    assert measured.restore_from == "memory"  # most recoveries loaded from memory
    # the Timings sample stays the storage loads (what `validate --timings` checks startup with)
    assert measured.timings.restore is not None and measured.timings.restore.median == pytest.approx(2.4)


def test_the_first_start_load_is_no_recovery() -> None:
    """Only memory recoveries: the figure is the memory median, though storage loads were seen."""
    log = Log().at(1.0, "checkpoint_restored", step=10, seconds=3.0, origin="storage", pid=1)
    log.step(11, None).step(20, 0.5)
    recovery(log, origin="memory", seconds=(0.1, 0.3), restarts=1)
    measured = measure_events(log.records(), "x")
    assert measured.by_origin["storage"].recoveries == 0 and measured.by_origin["storage"].loads == 1
    assert measured.restore_per_recovery() == pytest.approx(0.2)
    assert measured.restore_from == "memory"


def test_a_tie_and_an_old_log_without_origin_count_as_storage() -> None:
    log = Log().step(1, None).step(10, 0.5)
    recovery(log, origin="memory", seconds=(0.1, 0.1), restarts=1)
    log.at(1.0, "fault_injected", step=25, rank=0, pid=1, kind="sigkill")
    log.at(2.0, "checkpoint_restored", step=20, seconds=2.0, pid=3)  # says nothing: storage
    log.step(21, None, pid=3, restarts=2)
    measured = measure_events(log.records(), "x")
    assert measured.by_origin["storage"].recoveries == 1 and measured.restore_from == "storage"
    assert measured.restore_per_recovery() == pytest.approx(1.05)


def test_without_recoveries_the_loads_are_taken_as_before() -> None:
    log = Log().at(1, "checkpoint_restored", seconds=0.1, origin="memory")
    measured = measure_events(log.records(), "x")
    assert measured.restore_per_recovery() is None and measured.weighed == {}
    assert measured.by_origin["memory"].recoveries == 0


def tuned(log: Log, tmp_path: Path) -> Tuned:
    path = log.write(tmp_path / "events.jsonl")
    request = Request(from_run=path, step_time="1s", save_block="1s", save_write="2s", mtbf="6h")
    return tune_interval(request)


def test_tune_interval_uses_the_load_per_recovery(tmp_path: Path) -> None:
    result = tuned(mixed_run(), tmp_path)
    assert result.report.inputs.restore_s == pytest.approx(0.9)
    assert result.origins["restore"] == (
        "measured: 3 recoveries, 2 from memory (median 150ms) and 1 from storage (median 2.4s)"
    )
    assert not [n for n in result.notes if "host memory" in n]
    measured = result.to_dict()["measured"]
    assert measured["restore_from"] == "memory"
    assert measured["restore_by_origin"] == {
        "memory": {"loads": 4, "median_s": pytest.approx(0.15), "recoveries": 2},
        "peer": {"loads": 0, "median_s": None, "recoveries": 0},
        "storage": {"loads": 3, "median_s": pytest.approx(2.4), "recoveries": 1},
    }


def test_tune_interval_notes_what_only_memory_recoveries_leave_out(tmp_path: Path) -> None:
    log = Log().at(1.0, "checkpoint_restored", step=10, seconds=3.0, origin="storage", pid=1)
    log.step(11, None).step(20, 0.5)
    result = tuned(recovery(log, origin="memory", seconds=(0.1, 0.3), restarts=1), tmp_path)
    assert result.report.inputs.restore_s == pytest.approx(0.2)
    assert result.origins["restore"] == "measured: 1 recovery, 1 from memory (median 200ms)"
    note = next(n for n in result.notes if n.startswith("every recovery loaded from host memory"))
    assert "median 3s in this run" in note and "--restore" in note


def test_tune_interval_keeps_the_lost_node_note_when_only_memory_loads_were_seen(tmp_path: Path) -> None:
    log = Log().step(1, None).step(10, 0.5)
    result = tuned(recovery(log, origin="memory", seconds=(0.1, 0.3), restarts=1), tmp_path)
    assert result.report.inputs.restore_s == pytest.approx(0.2)
    assert any(
        n.startswith("only loads from host memory were measured") and "--restore" in n for n in result.notes
    )


def test_tune_interval_without_recoveries_takes_the_storage_loads(tmp_path: Path) -> None:
    log = Log().at(1.0, "checkpoint_restored", seconds=0.1, origin="memory", pid=1)
    log.at(1.0, "checkpoint_restored", seconds=2.0, origin="storage", pid=1).step(1, None)
    result = tuned(log, tmp_path)
    assert result.report.inputs.restore_s == pytest.approx(2.0)
    assert result.origins["restore"] == "measured: median of 1 loads from storage"
    assert result.to_dict()["measured"]["restore_from"] == "storage"


# -- a lost pod: the replaced pod's ranks load a peer's host copy, the others their own -----------


def pod_recovery(log: Log, loads: Sequence[tuple[str | None, float]], *, restarts: int) -> Log:
    """A pod lost and replaced: each rank (pid 1.., rank 0 first) loads step 20 from its origin
    (None: the load does not say) in its seconds."""
    log.at(1.0, "fault_injected", step=25, rank=0, pid=1, kind="sigkill")
    log.at(0.5, "worker_failed", local_rank=0, exit_code=-9, signal="SIGKILL", pid=99)
    log.at(0.0, "restart_begin", layer="in_job", pid=99)
    for rank, (origin, took) in enumerate(loads):
        where = {} if origin is None else {"origin": origin}
        log.at(took, "checkpoint_restored", step=20, seconds=took, pid=rank + 1, rank=rank, **where)
    log.step(21, None, pid=1, restarts=restarts)
    return log.step(30, 0.5, pid=1, restarts=restarts)


def peer_run(*, first_load: bool = True) -> Log:
    """A first start that loads from storage (3 s; none when not ``first_load``), a recovery
    from host memory, then a lost pod: ranks 0 and 1 load their own copy, 2 and 3 a peer's."""
    log = Log()
    if first_load:
        log.at(1.0, "checkpoint_restored", step=10, seconds=3.0, origin="storage", pid=1)
    log.step(11, None).step(20, 0.5)
    recovery(log, origin="memory", seconds=(0.1, 0.2), restarts=1)
    return pod_recovery(log, [("memory", 0.1), ("memory", 0.1), ("peer", 0.8), ("peer", 1.0)], restarts=2)


def test_a_lost_pod_whose_ranks_loaded_from_a_peer_counts_as_a_peer_recovery() -> None:
    measured = measure_events(peer_run().records(), "x")
    assert [r.restored_from for r in measured.recoveries] == ["memory", "peer"]
    assert measured.by_origin == {
        "memory": OriginLoads(loads=4, median=pytest.approx(0.1), recoveries=1),  # type: ignore[arg-type]
        "peer": OriginLoads(loads=2, median=pytest.approx(0.9), recoveries=1),  # type: ignore[arg-type]
        "storage": OriginLoads(loads=1, median=3.0, recoveries=0),
    }
    assert measured.restore_per_recovery() == pytest.approx((0.1 + 0.9) / 2)
    assert measured.restore_from == "peer"  # a tie with memory: the slower
    assert measured.timings.restore is not None and measured.timings.restore.median == pytest.approx(3.0)


def test_one_rank_that_read_storage_makes_the_recovery_a_storage_one() -> None:
    log = Log().at(1.0, "checkpoint_restored", step=10, seconds=3.0, origin="storage", pid=1)
    log.step(11, None).step(20, 0.5)
    recovery(log, origin="memory", seconds=(0.1, 0.2), restarts=1)
    loads = [("memory", 0.1), ("peer", 0.8), ("storage", 2.0), ("peer", 1.0)]
    measured = measure_events(pod_recovery(log, loads, restarts=2).records(), "x")
    assert [r.restored_from for r in measured.recoveries] == ["memory", "storage"]
    counts = {o: (v.loads, v.recoveries) for o, v in measured.by_origin.items()}
    assert counts == {"memory": (3, 1), "peer": (2, 0), "storage": (2, 1)}
    assert measured.by_origin["storage"].median == pytest.approx(2.5)
    assert measured.restore_per_recovery() == pytest.approx((0.1 + 2.5) / 2)
    assert measured.restore_from == "storage"


def test_restores_without_origin_still_read_as_storage() -> None:
    log = Log().step(1, None).step(10, 0.5)
    pod_recovery(log, [(None, 2.0), (None, 2.2), (None, 2.4), (None, 2.6)], restarts=1)
    measured = measure_events(log.records(), "x")
    assert [r.restored_from for r in measured.recoveries] == [None]  # the report shows "–"
    assert measured.by_origin["storage"] == OriginLoads(loads=4, median=pytest.approx(2.3), recoveries=1)  # type: ignore[arg-type]
    assert measured.by_origin["peer"] == OriginLoads(loads=0, median=None, recoveries=0)
    assert measured.by_origin["memory"] == OriginLoads(loads=0, median=None, recoveries=0)
    assert measured.restore_from == "storage" and measured.restore_per_recovery() == pytest.approx(2.3)


def test_tune_interval_weighs_the_peer_loads(tmp_path: Path) -> None:
    result = tuned(peer_run(), tmp_path)
    assert result.report.inputs.restore_s == pytest.approx(0.5)
    assert result.origins["restore"] == (
        "measured: 2 recoveries, 1 from memory (median 100ms) and 1 from peer (median 900ms)"
    )
    measured = result.to_dict()["measured"]
    assert measured["restore_from"] == "peer"
    assert measured["restore_by_origin"] == {
        "memory": {"loads": 4, "median_s": pytest.approx(0.1), "recoveries": 1},
        "peer": {"loads": 2, "median_s": pytest.approx(0.9), "recoveries": 1},
        "storage": {"loads": 1, "median_s": 3.0, "recoveries": 0},
    }
    storage_notes = [n for n in result.notes if "storage" in n]
    assert storage_notes == [
        "every recovery loaded from host memory or a peer; a recovery that finds no copy in memory "
        "(several pods lost at once, or a damaged copy) loads from storage (median 3s in this run): "
        "give --restore when that is common"
    ]


def test_tune_interval_does_not_say_only_memory_was_measured_when_peers_were(tmp_path: Path) -> None:
    result = tuned(peer_run(first_load=False), tmp_path)
    assert result.report.inputs.restore_s == pytest.approx(0.5)
    storage_notes = [n for n in result.notes if "storage" in n]
    assert storage_notes == [
        "only loads from host memory and a peer were measured; a recovery that finds no copy in "
        "memory (several pods lost at once, or a damaged copy) loads from storage and is slower: "
        "give --restore when that is common"
    ]


def test_tune_interval_names_the_peer_loads_when_every_recovery_read_memory(tmp_path: Path) -> None:
    log = Log().at(1.0, "checkpoint_restored", step=10, seconds=0.9, origin="peer", pid=1)
    log.at(0.0, "checkpoint_restored", step=10, seconds=3.0, origin="storage", pid=2)
    log.step(11, None).step(20, 0.5)
    result = tuned(recovery(log, origin="memory", seconds=(0.1, 0.3), restarts=1), tmp_path)
    assert result.report.inputs.restore_s == pytest.approx(0.2)
    assert [n for n in result.notes if "storage" in n] == [
        "every recovery loaded from host memory; a lost node or pod loads from a peer (median 900ms) "
        "or storage (median 3s in this run): give --restore when those are common"
    ]


def test_tune_interval_without_recoveries_takes_the_peer_loads_before_memory(tmp_path: Path) -> None:
    log = Log().at(1.0, "checkpoint_restored", seconds=0.1, origin="memory", pid=1)
    log.at(1.0, "checkpoint_restored", seconds=0.9, origin="peer", pid=2).step(1, None)
    result = tuned(log, tmp_path)
    assert result.report.inputs.restore_s == pytest.approx(0.9)
    assert result.origins["restore"] == "measured: median of 1 loads from peer"
    assert result.to_dict()["measured"]["restore_from"] == "peer"

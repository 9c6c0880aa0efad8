"""``build_report`` on hand-built events logs with round numbers: exact goodput, phases,
rollback, freshness and checkpoint figures."""

from __future__ import annotations

import pytest

from nvtrain.events.records import from_fields
from nvtrain.report import PHASES, Report, Stats, build_report, report_dict
from nvtrain.runlog import CAUSES
from support.report_logs import Log, first_stretch, lost_pod, two_recoveries


def report_of(log: Log) -> Report:
    return build_report(log.records(), "events.jsonl")


def test_stats_are_median_p95_max_total() -> None:
    stats = Stats.of([4, 1, 3, 2])
    assert stats == Stats(count=4, median=2.5, p95=pytest.approx(3.85), max=4.0, total=10.0)
    assert Stats.of([7]) == Stats(1, 7.0, 7.0, 7.0, 7.0)
    assert Stats.of([]) is None


def test_goodput_counts_each_kept_step_once() -> None:
    r = report_of(two_recoveries())
    assert r.time.total == 100
    assert (r.kept_steps, r.executed_steps, r.lost_steps, r.final_step) == (60, 70, 10, 60)
    assert r.kept_s == pytest.approx(60.0)  # 1 s a step; the saves' blocking is not step time
    assert r.lost_s == pytest.approx(10.0)  # steps 21-25 and 41-45, each replayed once
    assert r.training_goodput == pytest.approx(0.60)
    assert r.training_goodput_with_replays == pytest.approx(0.70)  # what the reference would say
    assert r.step_s == pytest.approx(1.0)


def test_infrastructure_goodput_and_where_the_time_went() -> None:
    r = report_of(two_recoveries())
    t = r.time
    assert t.startup == pytest.approx(4.0)  # launcher start to the first step
    assert t.up == pytest.approx(25 + 25 + 22)  # first step to fault; last stretch to its last event
    assert t.recovering == pytest.approx(4 + 13)
    assert t.shutdown == pytest.approx(7.0)  # last worker event (commit at 93) to launcher_exit
    assert t.startup + t.up + t.recovering + t.shutdown == pytest.approx(t.total)
    assert r.infrastructure_goodput == pytest.approx(0.72)


def test_recovery_phases_per_incident() -> None:
    first, second = report_of(two_recoveries()).incidents
    assert (first.layer, first.cause, first.recovered) == ("in_process", "exception (injected)", True)
    assert first.phases == {
        "detection": pytest.approx(1.0),  # fault -> restart_begin
        "teardown": pytest.approx(1.0),  # -> restart_end
        "rendezvous": None,  # in-process restarts have none: missing, not zero
        "start": pytest.approx(0.5),  # -> attempt_start
        "restore": pytest.approx(0.5),  # -> checkpoint_restored
        "first_step": pytest.approx(1.0),  # -> first completed step
    }
    assert first.seconds == pytest.approx(4.0) and first.start_t == pytest.approx(29.0)
    assert (second.layer, second.cause) == ("in_job", "sigkill (injected)")
    assert second.phases == {
        "detection": pytest.approx(1.0),  # fault -> the launcher's restart_begin
        "teardown": None,  # ft_launcher logs no end of teardown: inside the rendezvous phase
        "rendezvous": pytest.approx(1.0),
        "start": pytest.approx(6.0),  # new processes
        "restore": pytest.approx(4.0),
        "first_step": pytest.approx(1.0),
    }
    for incident in (first, second):
        assert sum(v for v in incident.phases.values() if v is not None) == pytest.approx(incident.seconds)
        assert incident.failed_attempts == 0
    # The load itself (the events' seconds): the rest of the restore phase was the script's set-up.
    assert (first.restore_load_s, second.restore_load_s) == (pytest.approx(0.5), pytest.approx(2.0))


def test_rollback_and_freshness_at_each_fault() -> None:
    r = report_of(two_recoveries())
    first, second = r.incidents
    assert (first.last_step, first.restored_step, first.rollback_steps) == (25, 20, 5)
    assert (first.restore_source, second.restore_source) == ("memory", "storage")
    assert (second.last_step, second.restored_step, second.rollback_steps) == (45, 40, 5)
    assert first.lost_s == pytest.approx(5.0) and second.lost_s == pytest.approx(5.0)
    # newest committed at the fault: step 20 (reached at 23.5 s) and step 40 (reached at 52.5 s)
    assert (first.freshness_steps, second.freshness_steps) == (5, 5)
    assert first.freshness_s == pytest.approx(5.5) and second.freshness_s == pytest.approx(5.5)
    assert r.rollback_steps == Stats(2, 5.0, 5.0, 5.0, 10.0)
    assert r.freshness_steps is not None and r.freshness_steps.max == 5


@pytest.mark.parametrize(
    ("origins", "source"),
    [
        (["memory", "memory", "peer", "peer"], "peer"),  # the replaced pod's ranks read a peer's copy
        (["peer", "peer", "memory", "memory"], "peer"),  # the slowest, not the last load, names it
        (["memory", "peer", "storage", "peer"], "storage"),  # one rank read storage: every rank waited
        (["memory", "memory", "memory", "memory"], "memory"),
        ([None, "peer", None, "memory"], "peer"),  # loads that do not say are left out
        ([None, None, None, None], None),  # none says: shown as "–"
    ],
)
def test_a_recovery_names_the_slowest_origin_its_ranks_loaded_from(
    origins: list[str | None], source: str | None
) -> None:
    first, second = report_of(lost_pod(origins)).incidents
    assert (first.restore_source, second.restore_source) == ("memory", source)
    assert (second.layer, second.restored_step, second.rollback_steps) == ("in_job", 40, 5)
    assert second.phases["restore"] == pytest.approx(4.0)  # 66 s attempt_start -> 70 s loads


def test_freshness_over_time_is_a_sawtooth() -> None:
    r = report_of(two_recoveries())
    series = r.freshness
    assert [t for t, _, _ in series] == sorted(t for t, _, _ in series)
    at = {(round(t, 3), n) for t, n, _ in series}
    assert (13.0, 10) in at  # step 10 reached, nothing committed yet
    assert (15.0, 10 + 2 - 10) in at  # step 10 committed at 15 s, when step 12 was reached
    assert (29.0, 5) in at and (58.0, 5) in at  # at the faults
    assert (93.0, 0) in at  # the final checkpoint
    assert min(n for _, n, _ in series) >= 0


def test_restarts_and_checkpoints() -> None:
    r = report_of(two_recoveries())
    assert r.restarts_by_layer == {"in_process": 1, "in_job": 1}
    assert r.restarts_by_cause == {"exception (injected)": 1, "sigkill (injected)": 1}
    assert r.failed_attempts == 0
    c = r.checkpoints
    assert (c.saves, c.committed, c.partial, c.corrupt, c.failed) == (6, 6, 0, 0, 0)
    assert c.blocked == Stats(6, 0.5, 0.5, 0.5, 3.0)
    assert c.background is not None and c.background.max == 2.5 and c.background.total == 11.5
    assert c.waited is None  # no save waited for the previous write
    assert [s for _, s in c.commits] == [10, 20, 30, 40, 50, 60]
    assert [layer.layer for layer in r.layers] == ["in_process", "in_job"]
    in_job = r.layers[1]
    assert in_job.total == Stats(1, 13.0, 13.0, 13.0, 13.0)
    assert in_job.phases["teardown"] is None and in_job.phases["start"] == Stats(1, 6.0, 6.0, 6.0, 6.0)
    assert set(in_job.phases) == set(PHASES)


def failed_restart_then_budget_spent() -> Log:
    """A SIGKILL at 25; the first in-job restart dies while loading, the second recovers; at 30 a
    worker is OOM-killed (exit 137) with the restart budget spent: the run exits 1."""
    log = first_stretch(Log())
    log.at(29, "fault_injected", step=25, pid=1, rank=0, kind="sigkill")
    log.at(29.5, "worker_failed", node=0, local_rank=0, exit_code=-9, signal="SIGKILL", step=20)
    log.at(30, "restart_begin", layer="in_job", node=0, attempts_left=2)
    log.at(31, "rendezvous_done", node=0, round=1)
    log.at(35, "attempt_start", pid=2, rank=0, world=1, iteration=0, restart_count=1)
    log.at(36, "worker_failed", node=0, local_rank=0, exit_code=1, signal=None, step=20)
    log.at(37, "restart_begin", layer="in_job", node=0, attempts_left=1)
    log.at(38, "rendezvous_done", node=0, round=2)
    log.at(42, "attempt_start", pid=3, rank=0, world=1, iteration=0, restart_count=2)
    log.at(44, "checkpoint_restored", step=20, pid=3, source="storage", seconds=1.5)
    log.step(45, 21, first=True, pid=3).step(54, 30, pid=3)
    log.at(57, "worker_failed", node=0, local_rank=0, exit_code=137, signal=None, step=30)
    return log.at(60, "launcher_exit", node=0, exit_code=1, cause="restart budget spent")


def test_failed_attempts_and_a_fault_never_recovered() -> None:
    r = report_of(failed_restart_then_budget_spent())
    first, last = r.incidents
    assert first.restarts == {"in_job": 2} and first.failed_attempts == 1 and first.recovered
    assert first.phases["rendezvous"] == pytest.approx(38.0 - 30.0)  # the failed attempt included
    assert first.seconds == pytest.approx(16.0)
    assert (last.cause, last.layer, last.recovered, last.seconds) == ("exit 137", "none", False, None)
    assert (first.cause_kind, last.cause_kind) == ("sigkill", "oom")
    assert last.phases["first_step"] is None and last.restarts == {}
    # Not recovered: the steps after the newest committed checkpoint (20) are lost.
    assert (last.last_step, last.rollback_steps) == (30, 10)
    assert r.exit_code == 1
    assert (r.final_step, r.kept_steps, r.lost_steps) == (20, 20, 15)
    t = r.time
    assert (t.startup, t.up, t.recovering, t.shutdown) == pytest.approx((4.0, 25 + 12, 16 + 3, 0.0))
    assert r.training_goodput == pytest.approx(20 / 60)
    assert any("incident 2 (exit 137) was not recovered" in note for note in r.notes)


def test_a_hang_is_detected_by_the_heartbeat_timeout() -> None:
    log = first_stretch(Log())
    log.at(29, "fault_injected", step=25, pid=1, rank=0, kind="hang")
    log.at(89, "hang_detected", node=0, local_rank=0)
    log.at(89.5, "worker_failed", node=0, local_rank=0, exit_code=-9, signal="SIGKILL", step=20)
    log.at(90, "restart_begin", layer="in_job", node=0, attempts_left=3)
    log.at(92, "rendezvous_done", node=0, round=1)
    log.at(100, "attempt_start", pid=2, rank=0, world=1, iteration=0, restart_count=1)
    log.at(105, "checkpoint_restored", step=20, pid=2, source="storage", seconds=3.0)
    log.step(106, 21, first=True, pid=2).step(115, 30, pid=2)
    log.at(120, "launcher_exit", node=0, exit_code=0, cause="finished")
    (incident,) = report_of(log).incidents
    assert (incident.cause, incident.cause_kind, incident.layer) == ("hang (injected)", "hang", "in_job")
    assert incident.phases["detection"] == pytest.approx(61.0)  # the heartbeat timeout
    assert incident.seconds == pytest.approx(77.0)


def test_two_ranks_count_one_restart_and_the_slowest_save() -> None:
    log = Log().at(0, "launcher_start", node=0)
    for pid, lag in ((1, 0.0), (2, 0.1)):
        log.step(4 + lag, 1, first=True, pid=pid).step(13 + lag, 10, pid=pid)
    log.save(13.2, 10, blocked=0.4, pid=1).save(13.2, 10, blocked=0.8, pid=2)
    for pid, lag in ((1, 0.0), (2, 0.1)):
        log.step(23.8 + lag, 20, pid=pid)
    log.at(24, "fault_injected", step=20, pid=2, kind="exception")
    log.at(25, "restart_begin", layer="in_process", pid=2, iteration=0)
    log.at(27, "restart_begin", layer="in_process", pid=1, iteration=0)
    log.at(28, "restart_end", layer="in_process", pid=1, iteration=1)
    log.at(28, "restart_end", layer="in_process", pid=2, iteration=1)
    for pid in (1, 2):
        log.step(30, 11, first=True, pid=pid, attempt=1)
    log.at(31, "launcher_exit", node=0, exit_code=0)
    r = report_of(log)
    (incident,) = r.incidents
    assert incident.restarts == {"in_process": 1}
    assert incident.phases["detection"] == pytest.approx(1.0)  # the first rank to notice
    assert incident.phases["teardown"] == pytest.approx(3.0)  # until every rank is back
    assert r.checkpoints.blocked == Stats(1, 0.8, 0.8, 0.8, 0.8)  # the slowest rank blocks all
    assert r.segments[0].work(10, 20) == pytest.approx(10.8 - 0.8)  # median step times, less 0.8
    assert r.ranks == 2


def test_a_pod_restarted_by_kubernetes() -> None:
    log = first_stretch(Log())
    log.at(29, "signal", node=0, signal="SIGTERM")
    log.at(31, "launcher_exit", node=0, exit_code=143, cause="stopped by SIGTERM")
    log.at(60, "launcher_start", node=0, source="launcher")
    log.at(70, "attempt_start", pid=5, rank=0, world=1, iteration=0, restart_count=0)
    log.at(72, "checkpoint_restored", step=20, pid=5, source="storage", seconds=1.0)
    log.step(73, 21, first=True, pid=5).step(82, 30, pid=5)
    log.at(85, "launcher_exit", node=0, exit_code=0)
    r = report_of(log)
    (incident,) = r.incidents
    assert (incident.cause, incident.layer, incident.restarts) == ("SIGTERM", "pod", {"pod": 1})
    assert incident.cause_kind == "stop"  # nvtrain run was told to stop: the pod was deleted
    assert incident.phases["detection"] == pytest.approx(31.0)  # until the new pod's launcher started
    assert incident.seconds == pytest.approx(44.0)
    assert r.exit_code == 0 and r.nodes == 1


@pytest.mark.parametrize(
    "stopped",
    [
        ("worker_ended", {"reason": "stopped"}),
        ("worker_failed", {"stopped": True}),  # as logs before worker_ended wrote it
    ],
    ids=["worker_ended", "old-worker_failed"],
)
def test_workers_told_to_stop_are_no_fault(stopped: tuple[str, dict[str, object]]) -> None:
    """The pod is stopped and replaced: its workers end on request (exit 143). The incident is
    the stop, and a peer that ft_launcher stopped late, after the recovery's first step, starts
    no incident of its own."""
    name, fields = stopped
    log = first_stretch(Log())
    log.at(29, "signal", node=0, signal="SIGTERM")
    log.at(29.5, name, source="launcher", node=0, local_rank=0, worker_pid=1, exit_code=143, **fields)
    log.at(31, "launcher_exit", node=0, exit_code=143, cause="stopped by SIGTERM")
    log.at(60, "launcher_start", node=0, source="launcher")
    log.step(73, 21, first=True, pid=5).step(82, 30, pid=5)
    ended = {"exit_code": -15, "signal": "SIGTERM", **fields}
    log.at(82.5, name, source="launcher", node=0, local_rank=1, worker_pid=6, **ended)
    log.step(83, 31, pid=5)
    log.at(85, "launcher_exit", node=0, exit_code=0)
    (incident,) = report_of(log).incidents
    assert (incident.cause, incident.cause_kind, incident.layer) == ("SIGTERM", "stop", "pod")


def test_a_restart_without_a_logged_fault_has_no_detection_phase() -> None:
    log = first_stretch(Log())
    log.at(30, "restart_begin", layer="in_process", pid=1, iteration=0)
    log.at(31, "restart_end", layer="in_process", pid=1, iteration=1)
    log.step(33, 21, first=True, attempt=1)
    (incident,) = report_of(log).incidents
    assert (incident.cause, incident.cause_kind, incident.fault_logged) == (
        "no fault logged",
        "unknown",
        False,
    )
    assert incident.phases["detection"] is None and incident.phases["teardown"] == pytest.approx(1.0)
    assert incident.seconds == pytest.approx(3.0)


def test_a_log_without_steps_has_no_goodput() -> None:
    log = Log().at(0, "launcher_start", node=0).at(2, "rendezvous_done", node=0)
    log.at(10, "worker_failed", node=0, local_rank=0, exit_code=1, signal=None)
    log.at(10.5, "restart_begin", layer="in_job", node=0, attempts_left=1)
    log.at(20, "launcher_exit", node=0, exit_code=0)
    r = report_of(log)
    assert r.training_goodput is None and r.infrastructure_goodput is None and r.final_step is None
    (incident,) = r.incidents
    assert (incident.cause, incident.recovered, incident.rollback_steps) == ("exit 1", False, None)
    assert incident.cause_kind == "exit"
    assert any("no `step` events" in note for note in r.notes)


def test_junk_and_nothing() -> None:
    junk = ({"event": "step"}, {"ts": "x"}, {"ts": True, "event": "step"})
    assert [from_fields(e) for e in junk] == [None] * 3  # not events: the reader skips them
    r = build_report([], "x")
    assert r.time.total == 0 and not r.incidents and r.training_goodput is None
    assert any("no launcher_exit" in note for note in r.notes)
    data = report_dict(r)
    assert data["incidents"] == [] and data["goodput"]["training"] is None


def test_saves_in_flight_at_soft_faults_finished_or_dropped() -> None:
    """checkpoint_settled: a save counts as kept only when every rank's part finished."""
    log = two_recoveries()
    # At the in-process fault (29 s), the save of step 20 was in flight: both ranks waited.
    log.at(29.1, "checkpoint_settled", step=20, pid=1, rank=0, waited_s=0.4, finished=True)
    log.at(29.2, "checkpoint_settled", step=20, pid=2, rank=1, waited_s=0.1, finished=True)
    # At the SIGKILL (58 s) the survivor waited out its limit for the save of step 40.
    log.at(58.6, "checkpoint_settled", step=40, pid=1, rank=0, waited_s=3.0, finished=False)
    log.events.sort(key=lambda e: e["ts"])
    ck = build_report(log.records(), "t").checkpoints
    assert (ck.finished_at_faults, ck.dropped_at_faults) == (1, 1)
    assert ck.settle_waited is not None and (ck.settle_waited.count, ck.settle_waited.max) == (2, 3.0)
    assert ck.settle_waited.median == pytest.approx(1.7)  # the slowest rank of each save: 0.4 and 3.0
    none = build_report(two_recoveries().records(), "t").checkpoints
    assert (none.finished_at_faults, none.dropped_at_faults, none.settle_waited) == (0, 0, None)


def test_a_worker_killed_from_outside_is_the_cause_and_the_in_job_restart_the_layer() -> None:
    """Seen in the soak (BENCHMARKS.md): a SIGKILL from outside (nothing injected); the
    survivors' in-process layer restarts a few ms after ft_launcher's in-job restart, naming the
    broken connection it saw. The cause is the kill, and the layer that recovered is in_job."""
    log = Log().step(0, 1, first=True).step(10, 10)
    log.at(11, "worker_failed", source="launcher", local_rank=1, worker_pid=2, exit_code=-9, signal="SIGKILL")
    log.at(11.01, "restart_begin", source="launcher", layer="in_job", attempts_left=3, max_restarts=3)
    log.at(
        11.04,
        "restart_begin",
        layer="in_process",
        rank=0,
        pid=1,
        iteration=1,
        cause="exception (RuntimeError)",
    )
    log.at(
        11.5,
        "worker_failed",
        source="launcher",
        local_rank=0,
        worker_pid=1,
        exit_code=-15,
        signal="SIGTERM",
        stopped=True,
    )
    log.step(20, 9, first=True, pid=3, attempt=0).step(30, 20, pid=3)
    (incident,) = build_report(log.records(), "events.jsonl").incidents
    assert (incident.cause, incident.cause_kind, incident.layer) == ("SIGKILL", "sigkill", "in_job")


Logged = tuple[float, str, dict[str, object]]
_IN_JOB: Logged = (30.0, "restart_begin", {"layer": "in_job", "node": 0, "attempts_left": 2})


def _injected(kind: str) -> list[Logged]:
    return [(29.0, "fault_injected", {"kind": kind, "pid": 1, "step": 25})]


def _in_process(cause: str) -> list[Logged]:
    return [(29.0, "restart_begin", {"layer": "in_process", "pid": 1, "iteration": 0, "cause": cause})]


def _failed(**fields: object) -> list[Logged]:
    return [(29.0, "worker_failed", {"node": 0, "signal": None, **fields}), _IN_JOB]


@pytest.mark.parametrize(
    ("events", "kind", "words"),
    [
        (_injected("collective_hang"), "hang", "collective_hang (injected)"),
        (_injected("collective_sigkill"), "sigkill", "collective_sigkill (injected)"),
        (_injected("sigterm"), "sigterm", "sigterm (injected)"),
        (_injected("oom"), "oom", "oom (injected)"),
        (_in_process("exception (ValueError)"), "exception", "exception (ValueError)"),
        (_in_process("peer soft timeout"), "hang", "peer soft timeout"),
        (_in_process("hard timeout"), "hang", "hard timeout"),
        (_in_process("peer terminated"), "signal", "peer terminated"),
        (_in_process("in-process restart"), "unknown", "in-process restart"),
        (_failed(exit_code=-11, signal="SIGSEGV"), "signal", "SIGSEGV"),
        (_failed(exit_code=1, raised="RuntimeError: x"), "exception", "exit 1"),
        (_failed(exit_code=-6, signal="SIGABRT", raised="RuntimeError: x"), "exception", "SIGABRT"),
        (
            [(29.0, "launcher_exit", {"node": 1, "exit_code": 3}), _IN_JOB],
            "launcher_failed",
            "launcher exit 3",
        ),
        ([(29.0, "relaunch", {"node": 1, "layer": "launcher", "attempt": 1})], "lost_node", "launcher lost"),
    ],
)
def test_each_cause_is_one_of_a_fixed_set(events: list[Logged], kind: str, words: str) -> None:
    """``first_stretch``, then ``events`` (a fault and its restart), then a first step."""
    log = first_stretch(Log())
    for t, name, fields in events:
        log.at(t, name, **fields)
    log.step(40, 21, first=True, pid=9).at(41, "launcher_exit", node=0, exit_code=0)
    (incident,) = report_of(log).incidents
    assert (incident.cause_kind, incident.cause) == (kind, words)
    assert incident.cause_kind in CAUSES


def test_a_restart_in_progress_has_not_failed_yet() -> None:
    """The newest restart of a recovery that goes on may still succeed: it counts as failed once
    another restart follows it, or once the run ends without a step after it."""
    log = first_stretch(Log())
    log.at(29.5, "worker_failed", node=0, local_rank=0, exit_code=1, signal=None, step=20)
    log.at(30, "restart_begin", layer="in_job", node=0, attempts_left=2)
    assert report_of(log).failed_attempts == 0
    log.at(36, "worker_failed", node=0, local_rank=0, exit_code=1, signal=None, step=20)
    log.at(37, "restart_begin", layer="in_job", node=0, attempts_left=1)
    assert report_of(log).failed_attempts == 1
    recovered, ended = Log(), Log()
    recovered.events = [*log.events]
    ended.events = [*log.events]
    recovered.step(45, 21, first=True, pid=3).at(50, "launcher_exit", node=0, exit_code=0)
    ended.at(50, "launcher_exit", node=0, exit_code=1, cause="restart budget spent")
    assert report_of(recovered).failed_attempts == 1  # the second restart reached a step
    assert report_of(ended).failed_attempts == 2  # neither did

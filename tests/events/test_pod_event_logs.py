"""One events log per pod (``events-node<N>.jsonl``): writers on different pods never share a
file, and every reader (report, tune-interval, validate --timings) merges the pods' logs in time
order; a run directory with the single ``events.jsonl`` of older versions still reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvtrain.errors import UsageError
from nvtrain.events import EventLog
from nvtrain.events.records import LauncherExit, LauncherStart, Step
from nvtrain.runlog import RunLog, RunTail, log_files, pod_events_file, pod_files, read_log
from nvtrain.tuning.sources import read_timings_or_log


def _pod(run_dir: Path, node: int) -> EventLog:
    return EventLog(pod_events_file(run_dir, node), node=node, run_id="r1", source="launcher")


def test_each_pod_writes_its_own_file_and_readers_merge_them_in_time_order(tmp_path: Path) -> None:
    run_dir = tmp_path / "r1"
    pods = [_pod(run_dir, node) for node in (0, 1, 10)]
    # Interleaved in time across the pods, each file in its own order.
    pods[1].emit(LauncherStart(ts=100.0))
    pods[0].emit(LauncherStart(ts=101.0))
    pods[2].emit(LauncherStart(ts=102.0))
    for i, ts in enumerate((110.0, 111.0, 112.0)):
        pods[i].emit(Step(ts=ts, rank=i, step=1, step_s=0.5))
    pods[0].emit(LauncherExit(ts=120.0, exit_code=0))

    names = sorted(p.name for p in run_dir.iterdir())
    assert names == ["events-node0.jsonl", "events-node1.jsonl", "events-node10.jsonl"]
    assert [p.name for p in pod_files(run_dir)] == names  # by node rank: 0, 1, 10
    for path in pod_files(run_dir):  # no line of another pod in a pod's file
        node = int(path.stem.removeprefix("events-node"))
        assert {json.loads(line)["node"] for line in path.read_text().splitlines()} == {node}

    target, events = read_log(run_dir, "RUN_DIR")
    assert target == run_dir and len(events) == 7
    log = RunLog(events)
    assert [e.ts for e in log.events] == [100.0, 101.0, 102.0, 110.0, 111.0, 112.0, 120.0]
    assert log.total == 20.0

    timings, findings = read_timings_or_log(run_dir)
    assert findings == [] and timings is not None and timings.step is not None


def test_one_pods_file_alone_can_be_read(tmp_path: Path) -> None:
    run_dir = tmp_path / "r1"
    _pod(run_dir, 0).emit(LauncherStart(ts=1.0))
    _pod(run_dir, 1).emit(LauncherStart(ts=2.0))
    target, events = read_log(pod_events_file(run_dir, 1))
    assert target == pod_events_file(run_dir, 1) and [e.ts for e in events] == [2.0]


def test_a_run_directory_of_an_older_version_still_reads(tmp_path: Path) -> None:
    legacy = EventLog(tmp_path / "events.jsonl", node=0, run_id="r0", source="launcher")
    legacy.emit(LauncherStart(ts=5.0))
    legacy.emit(LauncherExit(ts=6.0, exit_code=0))
    assert log_files(tmp_path) == [tmp_path / "events.jsonl"]
    assert [e.name for e in read_log(tmp_path)[1]] == ["launcher_start", "launcher_exit"]


def test_files_that_only_look_like_pod_logs_are_not_read(tmp_path: Path) -> None:
    for name in ("events-node.jsonl", "events-nodeX.jsonl", "events-node1.jsonl.tmp", "other.jsonl"):
        (tmp_path / name).write_text('{"ts": 1, "event": "launcher_start"}\n')
    (tmp_path / "events-node3.jsonl").mkdir()
    with pytest.raises(UsageError) as caught:
        read_log(tmp_path, "RUN_DIR")
    assert caught.value.message == f"RUN_DIR: {tmp_path} has no events log (events-node<N>.jsonl)"
    assert "run directory" in caught.value.fix


def test_no_valid_event_in_any_pods_log_names_the_directory(tmp_path: Path) -> None:
    pod_events_file(tmp_path, 0).write_text("not json\n")
    pod_events_file(tmp_path, 1).write_text("{torn")
    with pytest.raises(UsageError) as caught:
        read_log(tmp_path, "RUN_DIR")
    assert str(tmp_path) in caught.value.message and "1 line skipped" in caught.value.message


def test_a_tail_of_the_run_picks_up_each_pods_log_as_it_appears(tmp_path: Path) -> None:
    run_dir = tmp_path / "r1"
    tail = RunTail(run_dir)
    assert tail.poll() == []  # not even the directory yet
    pod0 = _pod(run_dir, 0)
    pod0.emit(LauncherStart(ts=1.0))
    assert [e.ts for e in tail.poll()] == [1.0]
    assert tail.poll() == []  # nothing new
    pod1 = _pod(run_dir, 1)
    pod1.emit(LauncherStart(ts=2.0))
    pod0.emit(Step(ts=3.0, rank=0, step=1, step_s=0.5))
    with pod_events_file(run_dir, 1).open("a") as handle:
        handle.write('not json\n{"ts": 4.0, "event": "step", "rank": 2, "st')  # a line being written
    assert sorted(e.ts for e in tail.poll()) == [2.0, 3.0]
    assert tail.skipped == 1
    with pod_events_file(run_dir, 1).open("a") as handle:
        handle.write('ep": 1, "step_s": 0.5}\n')
    (event,) = tail.poll()
    assert (event.name, event.ts, event.rank) == ("step", 4.0, 2)


def test_the_live_figures_are_the_whole_jobs(tmp_path: Path) -> None:
    from nvtrain.live import LiveFigures

    run_dir = tmp_path / "r1"
    live = LiveFigures(run_dir, refresh=0.0)
    _pod(run_dir, 0).emit(LauncherStart(ts=10.0))
    _pod(run_dir, 1).emit(LauncherStart(ts=11.0))
    _pod(run_dir, 1).emit(Step(ts=20.0, rank=3, step=7, step_s=0.5))
    assert live.update()
    report = live.report()
    assert report is not None and report.start_ts == 10.0
    assert report.segments[-1].last_step == 7  # the step pod 1's rank logged

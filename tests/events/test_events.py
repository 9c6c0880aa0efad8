"""The typed event records: one definition, what is written is what is read, and the docs'
table lists exactly the records and fields there are."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from nvtrain.events import SCHEMA_VERSION, EventLog, parse_event, read_events
from nvtrain.events.records import (
    EVENT_TYPES,
    CheckpointFailed,
    CheckpointRestored,
    CheckpointStaged,
    DnsResolved,
    Event,
    EventsLogError,
    OtherEvent,
    Step,
    WorkerEnded,
    WorkerFailed,
)
from nvtrain.runlog.checkpoints import load_times, loads_by_origin
from nvtrain.runlog.kinds import restore_origin

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def sample(cls: type[Event]) -> Event:
    """A record of ``cls`` with every own field set to a value of its type."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in ("ts", "host", "pid", "node", "run_id", "source", "rank", "v", "extra"):
            continue
        kind = str(f.type)
        values[f.name] = {
            "int | None": 7,
            "float | None": 0.25,
            "str | None": f"{f.name}-value",
            "bool | None": True,
            "tuple[str, ...] | None": ("a", "b"),
            "tuple[int, ...] | None": (1, 2),
        }[kind]
    return cls(rank=3, **values)


@pytest.mark.parametrize("cls", [c for c in EVENT_TYPES.values() if c.LOGGED], ids=lambda c: c.NAME)
def test_every_record_reads_back_as_written(tmp_path: Path, cls: type[Event]) -> None:
    log = EventLog(tmp_path / "events.jsonl", node=1, run_id="r", source="worker")
    written = sample(cls)
    line = log.emit(written)
    assert line["event"] == cls.NAME and line["v"] == SCHEMA_VERSION
    (read,) = read_events(log.path)
    assert type(read) is cls
    assert read.fields() == written.fields()
    assert (read.rank, read.node, read.run_id, read.source, read.v) == (3, 1, "r", "worker", SCHEMA_VERSION)
    assert read.ts == line["ts"] > 0


def test_fields_left_unset_are_not_written_except_a_first_steps_null_time(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    first = log.emit(Step(step=1))
    assert first["step_s"] is None and "attempt" not in first and "unsampled" not in first
    (read,) = read_events(log.path)
    assert isinstance(read, Step) and read.first_of_attempt


def test_user_metrics_and_unknown_fields_are_kept_in_extra(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    log.emit(Step(step=2, step_s=0.5, extra={"loss": 1.25}))
    (read,) = read_events(log.path)
    assert read.extra == {"loss": 1.25} and read.as_dict()["loss"] == 1.25


def test_an_unknown_event_name_reads_as_other_event() -> None:
    event = parse_event('{"ts": 5, "event": "from_a_newer_writer", "v": 9, "rank": 1, "what": [1]}')
    assert isinstance(event, OtherEvent)
    assert (event.name, event.v, event.rank, event.extra) == ("from_a_newer_writer", 9, 1, {"what": [1]})


def test_a_log_from_before_versions_reads_as_version_0() -> None:
    line = (
        '{"ts":1764669600.5,"event":"checkpoint_staged","host":"h","pid":9,"run_id":"r",'
        '"source":"worker","rank":0,"step":10,"blocked_s":0.01,"stage_s":0.009,"bytes":4096,"async":true}'
    )
    event = parse_event(line)
    assert isinstance(event, CheckpointStaged)
    assert (event.v, event.step, event.blocked_s, event.is_async, event.bytes) == (0, 10, 0.01, True, 4096)


def test_a_stop_logged_as_a_failure_by_older_versions_reads_as_worker_ended() -> None:
    """Before ``worker_ended``, a worker told to stop was a ``worker_failed`` with ``stopped``."""
    old = parse_event(
        '{"ts":1796448235.9,"event":"worker_failed","v":1,"node":0,"source":"launcher","rank":0,'
        '"local_rank":0,"worker_pid":7354,"exit_code":143,"signal":null,"step":1,"stopped":true}'
    )
    assert isinstance(old, WorkerEnded) and not isinstance(old, WorkerFailed)
    assert (old.reason, old.worker_pid, old.exit_code, old.step, old.extra) == ("stopped", 7354, 143, 1, {})
    assert old.as_dict()["event"] == "worker_ended" and "stopped" not in old.as_dict()
    # A real fault of those logs stays a failure.
    failed = parse_event('{"ts":5,"event":"worker_failed","local_rank":1,"exit_code":-9,"signal":"SIGKILL"}')
    assert isinstance(failed, WorkerFailed) and failed.signal == "SIGKILL"


def test_an_old_restore_named_its_origin_source() -> None:
    event = parse_event('{"ts": 1, "event": "checkpoint_restored", "step": 4, "source": "storage"}')
    assert isinstance(event, CheckpointRestored) and event.from_storage


@pytest.mark.parametrize(
    ("fields", "origin"),
    [
        ('"origin": "memory"', "memory"),
        ('"origin": "peer"', "peer"),  # a replaced pod's rank read another pod's host copy
        ('"origin": "storage"', "storage"),
        ('"source": "memory"', "memory"),  # before `origin`
        ('"origin": "disk"', None),
        ('"step": 4', None),
    ],
)
def test_where_a_restore_read_from(fields: str, origin: str | None) -> None:
    event = parse_event('{"ts": 1, "event": "checkpoint_restored", ' + fields + "}")
    assert isinstance(event, CheckpointRestored) and restore_origin(event) == origin


def restored(*loads: tuple[str | None, float]) -> list[Event]:
    """A ``checkpoint_restored`` per (origin, seconds); None: the load does not say."""
    out = []
    for origin, seconds in loads:
        where = {} if origin is None else {"origin": origin}
        event = parse_event(
            json.dumps({"ts": 1, "event": "checkpoint_restored", "seconds": seconds, **where})
        )
        assert event is not None
        out.append(event)
    return out


def test_loads_per_origin_and_the_slowest_origin_measured() -> None:
    events = restored(("memory", 0.1), ("peer", 0.8), ("peer", 1.0), ("memory", 0.2))
    assert loads_by_origin(events) == {"memory": (0.1, 0.2), "peer": (0.8, 1.0), "storage": ()}
    assert load_times(events) == ((0.8, 1.0), "peer")
    assert load_times([*events, *restored((None, 3.0))]) == ((3.0,), "storage")  # says nothing: storage
    assert load_times(restored(("memory", 0.1))) == ((0.1,), "memory")
    assert load_times([]) == ((), None)


@pytest.mark.parametrize(
    "line",
    [
        '{"ts": "now", "event": "step"}',
        '{"ts": 1, "event": 5}',
        '{"ts": 1e16, "event": "step"}',
        '{"ts": 1, "event": "step", "step": NaN}',
        '{"ts": 1, "event": "step", "step_s": "fast"}',
        '{"ts": 1, "event": "step", "step": true}',
        '{"ts": 1, "event": "worker_failed", "signal": ["SIGKILL"]}',
        '{"ts": 1, "event": "step", "host": {"a": 1}}',
        "[1, 2]",
        '{"ts": 1, "event": "step", "step": ' + "9" * 5000 + "}",
        "[" * 100_000,
    ],
)
def test_lines_that_are_not_events(line: str) -> None:
    assert parse_event(line) is None


def test_values_of_the_wrong_kind_that_carry_nothing_read_as_unset() -> None:
    event = parse_event(
        '{"ts": 1, "event": "worker_failed", "local_rank": 1.5, "hang": "yes", "signal": 9, "step": 3}'
    )
    assert isinstance(event, WorkerFailed)
    assert (event.local_rank, event.hang, event.signal, event.step) == (None, None, "9", 3)
    failed = parse_event('{"ts": 1, "event": "checkpoint_failed", "ranks": [0, "x"]}')
    assert isinstance(failed, CheckpointFailed) and failed.ranks is None


def test_aliased_fields_use_their_name_in_the_log(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    line = log.emit(DnsResolved(target="job-0.svc", addresses=("10.0.0.2",)))
    assert line["name"] == "job-0.svc" and line["addresses"] == ["10.0.0.2"]
    (read,) = read_events(log.path)
    assert isinstance(read, DnsResolved) and read.target == "job-0.svc" and read.addresses == ("10.0.0.2",)


def test_shown_only_records_are_never_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="never logged"):
        EventLog(tmp_path / "events.jsonl").emit(EventsLogError(error="full"))


def test_the_docs_table_lists_every_record_and_its_fields() -> None:
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"\| `(\w+)` \| (log|shown) \| (.*) \|", line)
        if match:
            rows[match.group(1)] = (match.group(2), re.findall(r"`(\w+)`", match.group(3)))
    expected = {
        name: ("log" if cls.LOGGED else "shown", list(sample(cls).fields()))
        for name, cls in EVENT_TYPES.items()
    }
    assert rows == expected, "docs/events.md's table differs from nvtrain/events/records.py"


def test_records_compare_by_value_and_have_no_instance_dict() -> None:
    a, b = Step(step=1, step_s=0.5), Step(step=1, step_s=0.5)
    assert a == b and a != dataclasses.replace(b, step=2)
    assert not hasattr(a, "__dict__")  # slots: a long log's records stay small
    assert json.loads(json.dumps(a.as_dict())) == a.as_dict()

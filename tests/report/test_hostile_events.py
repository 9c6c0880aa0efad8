"""Hostile lines in an events log: ``report``, ``tune-interval --from-run`` and the live figures
skip and count what is not a valid event and never crash; building a report stays linear in
the log (counted in executed lines and drawn artists, not timed: timing is in benchmarks/)."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

import nvtrain
from nvtrain.cli import app
from nvtrain.events import MAX_NUMBER, EventTail, read_events
from nvtrain.events.records import OtherEvent, from_fields
from nvtrain.live import LiveFigures, figures
from nvtrain.report import build_report, read_report, report_dict, write_timeline
from nvtrain.tuning.measured import measure_events, read_measured
from support.report_logs import CPU_LOG, ROOT

runner = CliRunner()
BASE = CPU_LOG.read_text(encoding="utf-8").splitlines()
MIDDLE = len(BASE) // 2
TS = json.loads(BASE[MIDDLE])["ts"]  # a time stamp in the middle of the run

HOSTILE = {
    "event-a-list": '{"ts":1,"event":[]}',
    "step-a-list": f'{{"ts":{TS},"event":"step","step":[],"step_s":0.1,"rank":0}}',
    "4301-digit-integer": f'{{"ts":{TS},"event":"step","step":{"9" * 4301},"step_s":0.1}}',
    "100000-nested-brackets": "[" * 100_000,
    "blocked_s-1e308": f'{{"ts":{TS},"event":"checkpoint_staged","step":40,"blocked_s":1e308,"rank":0}}',
    "seconds-infinite": f'{{"ts":{TS},"event":"checkpoint_restored","step":40,"seconds":1e999}}',
    "400-digit-restart_count": f'{{"ts":{TS},"event":"step","step":41,"restart_count":{"9" * 400}}}',
    "ts-nan": '{"ts":NaN,"event":"step","step":41}',
    "ts-infinite": '{"ts":-Infinity,"event":"fault_injected","step":41}',
    "ts-a-string": f'{{"ts":"{TS}","event":"step","step":41}}',
    "ts-a-bool": '{"ts":true,"event":"step","step":41}',
    "ts-missing": '{"event":"fault_injected","step":41}',
    "step_s-a-bool": f'{{"ts":{TS},"event":"step","step":41,"step_s":true}}',
    "iteration-a-list": f'{{"ts":{TS},"event":"restart_begin","layer":"in_process","iteration":[0]}}',
    "node-an-object": f'{{"ts":{TS},"event":"launcher_start","node":{{}}}}',
    "not-an-object": "[1, 2, 3]",
    "not-json": '{"ts": 1, "event": "step"',
}


def write_log(path: Path, line: str | None = None, *, at: int = MIDDLE) -> Path:
    """The CPU demo's log, with ``line`` inserted at line ``at``."""
    lines = BASE[:at] + ([line] if line is not None else []) + BASE[at:]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def invoke(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


def strict_json(text: str) -> Any:
    """JSON with no NaN or Infinity in it (``json.loads`` would accept them)."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON")

    return json.loads(text, parse_constant=refuse)


def report_json(path: Path) -> dict[str, Any]:
    result = invoke("report", str(path), "--json", "--no-timeline")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = strict_json(result.stdout)
    return data


def tune_json(path: Path) -> dict[str, Any]:
    result = invoke("tune-interval", "--from-run", str(path), "--mtbf", "2h", "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = strict_json(result.stdout)
    return data


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """The report and the tune-interval result of the log without a hostile line."""
    path = write_log(tmp_path_factory.mktemp("clean") / "events.jsonl")
    return report_json(path), tune_json(path)


@pytest.mark.parametrize("line", HOSTILE.values(), ids=HOSTILE.keys())
def test_report_skips_and_counts_a_hostile_line(
    tmp_path: Path, line: str, clean: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    path = write_log(tmp_path / "events.jsonl", line)
    data = report_json(path)
    assert data["skipped_lines"] == 1
    assert data["notes"] == [
        "skipped 1 malformed event line (not a JSON object with a finite `ts`, a "
        "string `event` and finite numbers in its numeric fields); the figures leave it out"
    ]
    expected = {**clean[0], "source": str(path), "notes": data["notes"], "skipped_lines": 1}
    assert data == expected  # every figure as if the line were not there

    text = invoke("report", str(path), "--no-timeline")
    assert text.exit_code == 0, text.output
    assert "skipped 1 malformed event line" in text.stdout.replace("\n", " ")


@pytest.mark.parametrize("line", HOSTILE.values(), ids=HOSTILE.keys())
def test_tune_interval_skips_a_hostile_line(
    tmp_path: Path, line: str, clean: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    path = write_log(tmp_path / "events.jsonl", line)
    assert tune_json(path) == {**clean[1], "events": str(path)}
    assert read_measured(path).skipped == 1


def test_a_fault_at_time_zero_is_an_incident_not_a_crash(tmp_path: Path) -> None:
    """A valid line with a hostile value: ``ts`` 0 makes the job 56 years long, but it is a number."""
    line = '{"ts":0,"event":"fault_injected","step":5,"rank":0,"kind":"sigkill"}'
    path = write_log(tmp_path / "events.jsonl", line, at=0)
    data = report_json(path)
    assert data["skipped_lines"] == 0 and data["start_ts"] == 0
    assert data["incidents"][0]["cause"] == "sigkill (injected)" and data["incidents"][0]["start_t_s"] == 0
    for at in (MIDDLE, len(BASE)):
        assert report_json(write_log(tmp_path / f"at-{at}.jsonl", line, at=at))["skipped_lines"] == 0
    assert tune_json(path)["mode"] == "async"
    png = tmp_path / "timeline.png"
    assert invoke("report", str(path), "--timeline", str(png)).exit_code == 0 and png.is_file()


def test_numbers_at_the_limit_are_kept_and_overflow_nothing(tmp_path: Path) -> None:
    big = int(MAX_NUMBER)
    lines = [
        f'{{"ts":{TS},"event":"checkpoint_staged","step":40,"blocked_s":{big},"rank":0}}',
        f'{{"ts":{TS},"event":"checkpoint_committed","step":{big},"write_s":{big},"rank":0}}',
        f'{{"ts":{TS},"event":"step","step":{big},"step_s":{big},"rank":0}}',
        f'{{"ts":{TS},"event":"checkpoint_restored","step":-{big},"seconds":{big},"origin":"storage"}}',
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(BASE[:MIDDLE] + lines + BASE[MIDDLE:]) + "\n", encoding="utf-8")
    assert report_json(path)["skipped_lines"] == 0
    assert tune_json(path)["mode"] in ("async", "sync")
    text = invoke("report", str(path), "--timeline", str(tmp_path / "t.png"))
    assert text.exit_code == 0, text.output


def test_only_complete_lines_are_counted(tmp_path: Path) -> None:
    path = write_log(tmp_path / "events.jsonl", "\n   \nnot json")
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"ts": 2000000000, "event": "step", "step_s": 9')  # torn: the writer was killed
    events = read_events(path)
    assert len(events) == len(BASE) and events.skipped == 1  # blank lines and the torn one: not counted
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"not json", b"\xff\xfe{\x00"))  # not UTF-8 either
    assert read_events(path).skipped == 1


def test_the_tail_counts_hostile_lines_once_they_are_complete(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.poll() == [] and tail.skipped == 0
    with path.open("ab") as handle:
        handle.write(("\n".join(BASE[:10]) + "\n" + HOSTILE["100000-nested-brackets"]).encode())
    assert len(tail.poll()) == 10 and tail.skipped == 0  # its line is not complete yet
    with path.open("ab") as handle:
        handle.write(("\n" + "\n".join(HOSTILE.values()) + "\n").encode() + b"\xff\xfe{\n")  # not UTF-8
    assert tail.poll() == [] and tail.skipped == 1 + len(HOSTILE) + 1  # the brackets' line is complete now


def test_the_live_figures_skip_hostile_lines(tmp_path: Path) -> None:
    path = write_log(tmp_path / "events.jsonl", "\n".join(HOSTILE.values()))
    live = LiveFigures(path, refresh=1.0)
    assert live.update()
    report = live.report()
    assert report is not None and report.skipped_lines == len(HOSTILE)
    assert report.incidents and live.families()


# -- any valid event, however odd: the model never raises ------------------------------------

_NAMES = (
    "launcher_start launcher_exit rendezvous_done worker_start attempt_start step checkpoint_begin "
    "checkpoint_staged checkpoint_committed checkpoint_already_committed checkpoint_restored "
    "checkpoint_settled checkpoint_partial checkpoint_corrupt checkpoint_rejected checkpoint_failed "
    "fault_injected restart_begin restart_end relaunch worker_failed hang_detected signal other"
).split()
_LIMIT = int(MAX_NUMBER)
_numbers = st.one_of(
    st.none(),
    st.integers(-3, 200),
    st.sampled_from([0, 0.0, 0.5, 5e-324, MAX_NUMBER, -MAX_NUMBER, _LIMIT]),
    st.floats(-MAX_NUMBER, MAX_NUMBER),
)
_names = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.sampled_from(["in_process", "in_job", "launcher", "pod", "storage", "memory", "peer 1", ""]),
)
_FIELDS = {
    **dict.fromkeys(
        "step step_s blocked_s waited_for_previous_s write_s seconds waited_s exit_code world rank "
        "restart_count iteration attempts_left attempt pid".split(),
        _numbers,
    ),
    **dict.fromkeys(
        "node host path layer kind cause signal origin source run_id async finished".split(), _names
    ),
}
_events = st.builds(
    lambda stamp, name, fields: {"ts": stamp, "event": name, **fields},
    st.one_of(st.integers(0, 100), st.floats(0, 100), st.sampled_from([MAX_NUMBER, -MAX_NUMBER])),
    st.sampled_from(_NAMES),
    st.lists(st.sampled_from(sorted(_FIELDS)), max_size=6, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: _FIELDS[k] for k in keys})
    ),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_events, max_size=40))
def test_any_valid_events_give_a_report(events: list[dict[str, Any]]) -> None:
    parsed = [(e, from_fields(e)) for e in events]  # a name in a number field is not valid
    records = [r for _, r in parsed if r is not None]
    assert all(isinstance(r, OtherEvent) == (e["event"] == "other") for e, r in parsed if r is not None)
    report = build_report(records, "fuzz", skipped=2)
    strict_json(json.dumps(report_dict(report)))
    figures(report, now=1e9)
    measure_events(records, "fuzz")


# -- linear in the log ---------------------------------------------------------------------------


def _scaling() -> ModuleType:
    spec = importlib.util.spec_from_file_location("report_scaling", ROOT / "benchmarks" / "report_scaling.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


synthetic_log: Callable[..., int] = _scaling().synthetic_log


def executed_lines(work: Callable[[], object]) -> int:
    """Lines of nvtrain's code that ``work`` executes (a loop body counts once per pass)."""
    package = str(Path(nvtrain.__file__).parent)
    lines = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal lines
        lines += event == "line"
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(package) else None

    sys.settrace(calls)
    try:
        work()
    finally:
        sys.settrace(None)
    return lines


def test_the_work_per_event_does_not_grow_with_the_log(tmp_path: Path) -> None:
    """Restart-heavy logs (an incident per ~50 events) of 1x and 4x the size: the report and the
    measured timings execute the same number of lines per event. Before the fix, recoveries
    scanned every earlier event and each incident every commit: 4x the log, 7-11x the lines."""
    per_event = []
    for size in (150_000, 600_000):
        path = tmp_path / f"events-{size}.jsonl"
        synthetic_log(path, size, ranks=2, cycle_steps=12)
        events = read_events(path)
        report = executed_lines(functools.partial(build_report, events, "x"))
        measured = executed_lines(functools.partial(measure_events, events, "x"))
        per_event.append((report / len(events), measured / len(events)))
    (report_small, measured_small), (report_large, measured_large) = per_event
    assert report_large < 1.1 * report_small
    assert measured_large < 1.1 * measured_small


def test_the_timeline_draws_a_fixed_number_of_artists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faults, recoveries and stretches are collections, not one artist each: a run of 4x the
    incidents draws as many artists (before: several per incident, and matplotlib's layout
    and autoscaling went over all of them for each new one)."""
    from matplotlib.figure import Figure

    drawn: list[int] = []
    savefig = Figure.savefig

    def count(self: Figure, *args: Any, **kwargs: Any) -> None:
        drawn.append(sum(len(ax.get_children()) for ax in self.axes))
        savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", count)
    incidents = []
    for size in (150_000, 600_000):
        path = tmp_path / f"events-{size}.jsonl"
        synthetic_log(path, size, ranks=2, cycle_steps=12)
        report = read_report(path)
        incidents.append(len(report.incidents))
        write_timeline(report, tmp_path / f"t-{size}.png")
    assert 40 < incidents[0] and 3.5 * incidents[0] < incidents[1]
    assert drawn[0] == drawn[1]


def test_a_5_mb_restart_heavy_log(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = synthetic_log(path, 5_000_000)
    faults = path.read_text(encoding="utf-8").count('"event":"fault_injected"')
    report = read_report(path)
    assert report.skipped_lines == 0 and report.notes == ()
    assert len(report.incidents) == faults > 150 and all(i.recovered for i in report.incidents)
    assert report.restarts_by_layer.keys() == {"in_process", "in_job", "launcher", "pod"}
    assert report.failed_attempts > 0 and report.checkpoints.corrupt > 0
    assert report.kept_steps + report.lost_steps == report.executed_steps
    assert report.final_step == report.segments[-1].last_step
    strict_json(json.dumps(report_dict(report)))
    measured = read_measured(path)
    assert sum(measured.counts[k] for k in ("restart_in_process", "restart_in_job")) == faults
    assert measured.skipped == 0 and events > 25_000

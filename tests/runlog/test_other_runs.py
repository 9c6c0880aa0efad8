"""A run's report (and ``tune-interval --from-run``) reads that run's events only: a log of
another run in its folder (a pod's file copied in, a folder reused) is left out, and a warning
line (and ``--json``'s ``left_out``) names the file, its lines and why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner, Result

from nvtrain.cli import app
from nvtrain.report import read_report
from nvtrain.runlog import read_log
from support.report_logs import CPU_LOG, V0_LOG

runner = CliRunner()


def invoke(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def v0_run_with_a_stranger(tmp_path: Path) -> Path:
    """The v0 run's folder (named after its run id, as `nvtrain run` names it), holding its own
    log as node 0's and the CPU demo's log (run ``demo3``) as node 1's."""
    run_dir = tmp_path / "events-v0"
    run_dir.mkdir()
    shutil.copy(V0_LOG, run_dir / "events-node0.jsonl")
    shutil.copy(CPU_LOG, run_dir / "events-node1.jsonl")
    return run_dir


def test_a_log_of_another_run_in_the_folder_is_left_out_with_a_warning(tmp_path: Path) -> None:
    run_dir = v0_run_with_a_stranger(tmp_path)
    alone = invoke("report", str(V0_LOG), "--json", "--no-timeline")
    result = invoke("report", str(run_dir), "--json", "--no-timeline")
    assert result.exit_code == 0, result.output
    data, own = json.loads(result.stdout), json.loads(alone.stdout)
    # the figures are the v0 run's alone (before: both runs' events merged into one "run" of 71 h)
    for key in ("run_id", "ranks", "steps", "incidents", "time_s", "goodput"):
        assert data[key] == own[key], key
    stranger = str(run_dir / "events-node1.jsonl")
    lines = len(CPU_LOG.read_text(encoding="utf-8").splitlines())
    assert data["left_out"] == [
        {"file": stranger, "run_id": "demo3", "events": lines, "lines": [[1, lines]], "whole_file": True}
    ]
    assert own["left_out"] == [] and own["warnings"] == []
    (warning,) = data["warnings"]
    assert warning.startswith(f"{stranger}: all its {lines} events left out (lines 1-{lines}): ")
    assert "they belong to run 'demo3', not to run 'events-v0'" in warning
    assert f"the name of the folder {run_dir}" in warning
    # the warning is printed on stderr, as one line, with --json and without
    assert result.stderr.strip() == f"nvtrain: warning: {warning}"
    printed = invoke("report", str(run_dir), "--no-timeline")
    assert printed.exit_code == 0
    assert printed.stderr.strip() == f"nvtrain: warning: {warning}"
    assert printed.stdout.startswith("run events-v0: 1 node, 2 ranks, 23.5s in all")


def test_lines_of_another_run_inside_a_file_are_named_by_number(tmp_path: Path) -> None:
    # Without a folder named after a run, the run most events belong to is the run.
    own = V0_LOG.read_text(encoding="utf-8").splitlines()
    other = [line.replace('"run_id":"events-v0"', '"run_id":"old-run"') for line in own[:3]]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(own[:10] + other + own[10:] + other[:1]) + "\n", encoding="utf-8")
    _, events = read_log(mixed, "RUN_DIR")
    assert events.run_id == "events-v0" and len(events) == len(own)
    ((gone),) = events.left_out
    assert (gone.run_id, gone.lines, gone.events, gone.whole_file) == (
        "old-run",
        ((11, 13), (len(own) + 4,) * 2),
        4,
        False,
    )
    report = read_report(mixed)
    assert report.run_id == "events-v0" and report.time.total == read_report(V0_LOG).time.total
    (warning,) = report.warnings
    assert f"4 events left out (lines 11-13, {len(own) + 4})" in warning
    assert f"its share of the events with a run id: {len(own)} of {len(own) + 4}" in warning


def test_tune_interval_measures_the_run_alone_and_warns(tmp_path: Path) -> None:
    run_dir = v0_run_with_a_stranger(tmp_path)
    args = ("tune-interval", "--mtbf", "6h", "--json")
    mixed = invoke(*args, "--from-run", str(run_dir))
    alone = invoke(*args, "--from-run", str(V0_LOG))
    assert mixed.exit_code == 0 and alone.exit_code == 0, mixed.output
    measured, own = json.loads(mixed.stdout)["measured"], json.loads(alone.stdout)["measured"]
    assert measured["counts"] == own["counts"] and measured["timings"] == own["timings"]
    (warning,) = measured["warnings"]
    assert "they belong to run 'demo3'" in warning
    assert mixed.stderr.strip() == f"nvtrain: warning: {warning}"

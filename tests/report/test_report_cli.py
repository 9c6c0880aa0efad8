"""``nvtrain report`` through typer's CliRunner: the summary, --json, the PNG, bad inputs."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NoReturn

import pytest
from typer.testing import CliRunner, Result

import nvtrain.runlog.files
from nvtrain.cli import app
from nvtrain.report import TIMELINE_FILE
from support.report_logs import CPU_LOG, ROOT, lost_pod, two_recoveries

runner = CliRunner()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

JSON_KEYS = {
    "schema",
    "source",
    "run_id",
    "start_ts",
    "nodes",
    "ranks",
    "exit_code",
    "definitions",
    "goodput",
    "time_s",
    "steps",
    "incidents",
    "recovery",
    "restarts",
    "rollback",
    "freshness",
    "checkpoints",
    "segments",
    "notes",
    "skipped_lines",
    "left_out",
    "warnings",
    "timeline",
}
INCIDENT_KEYS = {
    "index",
    "layer",
    "cause",
    "fault_logged",
    "recovered",
    "start_t_s",
    "end_t_s",
    "recovery_s",
    "phases_s",
    "restarts",
    "failed_attempts",
    "last_step",
    "restored_step",
    "restore_source",
    "restore_load_s",
    "rollback_steps",
    "rollback_s",
    "freshness_steps",
    "freshness_s",
}
STATS_KEYS = {"count", "median", "p95", "max", "total"}


def report(*args: str) -> Result:
    result = runner.invoke(app, ["report", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory holding a copy of the CPU demo's events log."""
    folder = tmp_path / "demo3"
    folder.mkdir()
    shutil.copy(CPU_LOG, folder / "events.jsonl")
    return folder


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_summary_and_timeline_next_to_the_log(run_dir: Path) -> None:
    result = report(str(run_dir))
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    out = result.stdout
    assert "run demo3" in out and "final step 120" in out
    assert "training        14.8%" in out and "infrastructure  18.1%" in out
    assert "rolled-back steps excluded" in out  # the definitions are printed
    assert "17.9% if its 20 rolled-back steps counted" in out
    assert "exception (injected)" in out and "sigkill (injected)" in out
    for header in ("detection", "teardown", "rendezvous", "restore", "first step", "median", "p95", "max"):
        assert header in out
    assert "Restarts    by layer: in_process 1, in_job 1" in out
    assert "Checkpoints 6 saves, 6 committed" in out
    png = run_dir / TIMELINE_FILE
    assert f"timeline: {png}" in out
    assert png.stat().st_size > 30_000
    assert png_size(png) == (1560, 864)


def test_json(run_dir: Path) -> None:
    result = report(str(run_dir / "events.jsonl"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == JSON_KEYS
    assert data["schema"] == 1 and data["run_id"] == "demo3" and data["exit_code"] == 0
    assert data["timeline"] == str(run_dir / TIMELINE_FILE) and Path(data["timeline"]).is_file()
    assert set(data["goodput"]) == {"training", "infrastructure", "training_with_replays"}
    assert data["goodput"]["training"] == pytest.approx(0.1476, abs=1e-3)
    assert set(data["definitions"]) == {"total_job_time", "training_goodput", "infrastructure_goodput"}
    assert set(data["time_s"]) == {"total", "startup", "up", "recovering", "shutdown"}
    assert data["steps"]["final"] == 120 and data["steps"]["rolled_back"] == 20
    assert [set(i) for i in data["incidents"]] == [INCIDENT_KEYS, INCIDENT_KEYS]
    first = data["incidents"][0]
    assert set(first["phases_s"]) == {"detection", "teardown", "rendezvous", "start", "restore", "first_step"}
    assert first["phases_s"]["rendezvous"] is None  # missing, not zero
    assert set(data["recovery"]) == {"in_process", "in_job"}
    assert set(data["recovery"]["in_job"]["total_s"]) == STATS_KEYS
    assert data["recovery"]["in_job"]["phases_s"]["teardown"] is None
    assert data["restarts"] == {
        "by_layer": {"in_process": 1, "in_job": 1},
        "by_cause": {"exception (injected)": 1, "sigkill (injected)": 1},
        "failed_attempts": 0,
    }
    assert set(data["rollback"]["steps"]) == STATS_KEYS and data["rollback"]["steps"]["max"] == 10
    assert set(data["freshness"]) == {"at_faults", "series"}
    assert set(data["freshness"]["series"][0]) == {"t_s", "steps", "seconds"}
    assert set(data["checkpoints"]) == {
        "saves",
        "committed",
        "partial",
        "corrupt",
        "failed",
        "blocked_s",
        "blocked_fraction",
        "waited_for_previous_s",
        "background_s",
        "in_flight_at_faults",
        "commits",
    }
    assert data["checkpoints"]["in_flight_at_faults"] == {"finished": 0, "dropped": 0, "waited_s": None}
    assert len(data["segments"]) == 3 and data["notes"] == []


def test_hand_built_log_in_json(tmp_path: Path) -> None:
    path = two_recoveries().write(tmp_path / "events.jsonl")
    data = json.loads(report(str(path), "--json", "--no-timeline").stdout)
    assert data["timeline"] is None and not (tmp_path / TIMELINE_FILE).exists()
    assert data["goodput"] == {"training": 0.6, "infrastructure": 0.72, "training_with_replays": 0.7}
    assert data["time_s"] == {"total": 100.0, "startup": 4.0, "up": 72.0, "recovering": 17.0, "shutdown": 7.0}
    assert [i["recovery_s"] for i in data["incidents"]] == [4.0, 13.0]


def test_the_incidents_table_says_where_each_restore_read_from(tmp_path: Path) -> None:
    path = two_recoveries().write(tmp_path / "events.jsonl")
    printed = report(str(path), "--no-timeline").stdout
    table = printed.split("Incidents", 1)[1].split("Recovery phases", 1)[0]
    assert re.search(r"step→resumed\s+from\s+rolled back", table), table
    assert re.search(r"25→20\s+memory\s", table) and re.search(r"45→40\s+storage\s", table), table


def test_a_pod_restored_from_a_peer_reads_peer_in_the_table_and_the_json(tmp_path: Path) -> None:
    path = lost_pod(["memory", "memory", "peer", "peer"]).write(tmp_path / "events.jsonl")
    printed = report(str(path), "--no-timeline").stdout
    table = printed.split("Incidents", 1)[1].split("Recovery phases", 1)[0]
    assert re.search(r"25→20\s+memory\s", table) and re.search(r"45→40\s+peer\s", table), table
    data = json.loads(report(str(path), "--json", "--no-timeline").stdout)
    assert [i["restore_source"] for i in data["incidents"]] == ["memory", "peer"]
    path = lost_pod(["memory", "storage", "peer", "peer"]).write(tmp_path / "events.jsonl")
    data = json.loads(report(str(path), "--json", "--no-timeline").stdout)
    assert [i["restore_source"] for i in data["incidents"]] == ["memory", "storage"]


def test_timeline_elsewhere(run_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "out.png"
    result = report(str(run_dir), "--timeline", str(target))
    assert result.exit_code == 0, result.output
    assert target.read_bytes()[:8] == PNG_SIGNATURE and not (run_dir / TIMELINE_FILE).exists()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: p, "has no events log"),
        (lambda p: _write(p / "events.jsonl", ""), "holds no events"),
        (lambda p: _write(p / "events.jsonl", "not json\n{torn"), "holds no events"),
        (lambda p: _write(p / "events.jsonl", '{"event": "step"}\n'), "holds no events with a time stamp"),
    ],
    ids=["missing", "no-log", "empty", "junk", "no-times"],
)
def test_unusable_logs_exit_2_naming_the_path(tmp_path: Path, make: object, message: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    result = report(str(path))
    assert result.exit_code == 2
    assert message in result.stderr and str(path) in result.stderr.replace("\n", "")
    assert "fix:" in result.stderr and result.stdout == ""


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_unreadable_log_exits_2(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(path: Path, what: str) -> NoReturn:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(nvtrain.runlog.files, "_numbered_events", denied)
    result = report(str(run_dir))
    assert result.exit_code == 2
    assert "cannot be read (Permission denied)" in result.stderr


def test_unwritable_timeline_exits_2(run_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "no-such-dir" / "t.png"
    result = report(str(run_dir), "--timeline", str(target))
    assert result.exit_code == 2
    assert str(target) in result.stderr.replace("\n", "") and "--no-timeline" in result.stderr


def test_timeline_options_conflict(run_dir: Path) -> None:
    result = report(str(run_dir), "--timeline", "x.png", "--no-timeline")
    assert result.exit_code == 2 and "cannot be used together" in result.stderr


def run_python(code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_report_does_not_import_torch(run_dir: Path) -> None:
    result = run_python(
        f"""
        import json, sys
        from typer.testing import CliRunner
        from nvtrain.cli import app

        runner = CliRunner()
        codes = [
            runner.invoke(app, ["report", {str(run_dir)!r}]).exit_code,
            runner.invoke(app, ["report", {str(run_dir)!r}, "--json"]).exit_code,
            runner.invoke(app, ["report", "--help"]).exit_code,
        ]
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "nvidia_resiliency_ext"))
        print(json.dumps({{"codes": codes, "heavy": heavy}}))
        """
    )
    assert result == {"codes": [0, 0, 0], "heavy": []}


def test_without_matplotlib_the_report_is_printed_and_one_line_names_the_extra(run_dir: Path) -> None:
    asked = run_dir.parent / "asked.png"
    result = run_python(
        f"""
        import json, sys
        sys.modules["matplotlib"] = None  # as if it were not installed
        from typer.testing import CliRunner
        from nvtrain.cli import app

        runner = CliRunner()
        text = runner.invoke(app, ["report", {str(run_dir)!r}])
        as_json = runner.invoke(app, ["report", {str(run_dir)!r}, "--json"])
        skipped = runner.invoke(app, ["report", {str(run_dir)!r}, "--no-timeline"])
        asked = runner.invoke(app, ["report", {str(run_dir)!r}, "--timeline", {str(asked)!r}])
        print(json.dumps({{
            "codes": [r.exit_code for r in (text, as_json, skipped, asked)],
            "out": [text.stdout, as_json.stdout],
            "err": [r.stderr for r in (text, as_json, skipped, asked)],
        }}))
        """
    )
    assert result["codes"] == [0, 0, 0, 2]  # only a PNG that was asked for is an error
    text_out, json_out = result["out"]
    assert "goodput" in text_out.lower()
    assert json.loads(json_out)["timeline"] is None
    text_err, json_err, skipped_err, asked_err = (" ".join(str(e).split()) for e in result["err"])
    for err in (text_err, json_err):
        assert err.count("no timeline PNG: matplotlib is not installed") == 1, err
        assert "pip install 'nvtrain[report]'" in err
    assert skipped_err == ""
    assert "pip install 'nvtrain[report]'" in asked_err and not asked.exists()


def test_a_timeline_that_cannot_be_written_gets_the_report_and_one_line(run_dir: Path) -> None:
    # A folder where the PNG would go: the write fails as on a read-only mount, for root too.
    (run_dir / TIMELINE_FILE).mkdir()
    result = report(str(run_dir))
    assert result.exit_code == 0, result.output
    assert "goodput" in result.stdout.lower()
    assert "no timeline PNG: cannot write the timeline" in " ".join(result.stderr.split())


def test_the_example_in_the_docs_is_what_the_command_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    page = (ROOT / "docs" / "report.md").read_text(encoding="utf-8")
    shown = page.split("## Example", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    command, _, printed = shown.partition("\n")
    assert command == "$ nvtrain report tests/tuning/data/cpu-demo-events.jsonl --no-timeline"
    monkeypatch.chdir(ROOT)
    result = report(*command.split()[3:])
    assert result.exit_code == 0, result.output
    assert "\n".join(line.rstrip() for line in result.stdout.splitlines()) == printed.rstrip("\n")


def test_the_library_loads_neither_the_cli_stack_nor_matplotlib() -> None:
    result = run_python(
        f"""
        import json, sys
        from pathlib import Path
        from nvtrain.report import read_report, report_dict

        report_dict(read_report(Path({str(CPU_LOG)!r})))
        heavy = {{"typer", "rich", "click", "torch", "nvidia_resiliency_ext", "matplotlib"}}
        print(json.dumps({{"loaded": sorted({{m.split(".")[0] for m in sys.modules}} & heavy)}}))
        """
    )
    assert result == {"loaded": []}

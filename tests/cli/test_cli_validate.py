"""``nvtrain validate`` through typer's CliRunner (stdout and stderr are captured apart)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from nvtrain.cli import app
from nvtrain.config import validate_file
from nvtrain.config.paths import resolve_relative
from nvtrain.nvrx import NvrxVersion

POLICIES = Path(__file__).resolve().parents[1] / "config" / "policies"
MANY = POLICIES / "invalid" / "many_problems.toml"
WARNINGS = POLICIES / "valid" / "warnings.toml"
MINIMAL = '[job]\nname = "x"\nscript = "t.py"\n'

runner = CliRunner()


def validate(*args: str) -> Result:
    result = runner.invoke(app, ["validate", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


def write(tmp_path: Path, text: str, name: str = "policy.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_runner_keeps_stdout_and_stderr_apart() -> None:
    result = validate(str(MANY), "--nvrx", "0.4.1")
    assert result.stdout == ""
    assert result.stderr.startswith("nvtrain: ")
    assert result.output == result.stderr


def test_demo_policy_without_arguments() -> None:
    result = validate()
    assert result.exit_code == 0
    assert result.stdout.startswith("<built-in demo policy> is valid (NVRx ")
    assert "effective policy:" in result.stdout


def test_demo_policy_with_a_fixed_nvrx() -> None:
    result = validate("--nvrx", "0.4.1")
    assert result.exit_code == 0
    assert result.stderr == ""
    first, *rows = result.stdout.splitlines()
    assert first.rstrip() == "<built-in demo policy> is valid (NVRx 0.4.1); effective policy:"
    # Not a terminal: one setting per line, whole values, defaults marked.
    lines = [row.strip() for row in rows]
    assert '[job] name = "nvtrain-demo"' in lines
    assert "[job] script = (not set)  (default)" in lines
    assert '[heartbeat] timeout = "20s"' in lines
    assert '[restart.in_job] policy = "any-failed"  (default)' in lines
    assert "faults = 2 fault(s)" in lines


def test_demo_policy_against_nvrx_0_7() -> None:
    result = validate("--nvrx", "0.7.0")
    assert result.exit_code == 0
    assert "is valid (NVRx 0.7.0)" in result.stdout
    assert "info [restart.in_process] enabled = true" in result.stderr


def test_invalid_file_exits_2_and_names_file_line_key_value_and_fix(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "[rendezvous]\nport = 0\n")
    result = validate(str(path), "--nvrx", "0.4.1")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"nvtrain: {path}: 1 error",
        f"  {path}:5:1: error [rendezvous] port = 0",
        "      must be >= 1",
        "      fix: use a value >= 1 (default: 29500)",
    ]


def test_every_problem_is_reported_at_once() -> None:
    result = validate(str(MANY), "--nvrx", "0.4.1")
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    # The relative [checkpoint] dir is an info: resolved where the command started (issue 39).
    assert lines[0] == f"nvtrain: {MANY}: 9 errors, 1 warning"
    places = [line.strip() for line in lines if line.startswith(f"  {MANY}:")]
    assert places == [
        f'{MANY}:3:1: error [job] name = "Many Problems"',
        f'{MANY}:5:1: error [job] module = "train"',
        f"{MANY}:11:1: error [rendezvous] port = 0",
        f"{MANY}:13:1: error [rendezvous] min_nodes = 3",
        f'{MANY}:17:1: error [heartbeat] initial_timeout = "5m"',
        f'{MANY}:21:1: error [restart.in_job] max_restarts = "five"',
        f'{MANY}:24:1: info [checkpoint] dir = "relative"',
        f"{MANY}:25:1: error [checkpoint] keep = 1",
        f"{MANY}:26:1: warning [checkpoint] interval = 1000",
        f"{MANY}:29:1: error [[faults]] #1 step = 200",
        f"{MANY}:30:1: error [[faults]] #1 rank = 9",
    ]
    assert sum(line.startswith("      fix: ") for line in lines) == 11


def test_syntax_error_shows_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, '[job]\nname = "x"\nscript = train.py\n')
    result = validate(str(path), "--nvrx", "0.4.1")
    assert result.exit_code == 2
    assert f"  {path}:3:10: error (top level)\n      TOML syntax error: invalid value\n" in result.stderr


def test_warnings_exit_0_and_1_with_strict() -> None:
    plain = validate(str(WARNINGS), "--nvrx", "0.4.1")
    assert plain.exit_code == 0
    assert plain.stderr.splitlines()[0] == f"nvtrain: {WARNINGS}: 3 warnings"
    assert f"{WARNINGS} is valid (NVRx 0.4.1);" in plain.stdout
    strict = validate(str(WARNINGS), "--nvrx", "0.4.1", "--strict")
    assert strict.exit_code == 1
    assert strict.stderr == plain.stderr


def test_strict_ignores_info_findings() -> None:
    result = validate(str(POLICIES / "valid" / "hot_spares_nvrx_0_7.toml"), "--nvrx", "0.7.0", "--strict")
    assert result.exit_code == 0
    assert result.stderr.splitlines()[0].endswith(": no errors or warnings")
    assert " info [rendezvous] min_nodes = 4" in result.stderr


def test_strict_with_errors_is_still_2() -> None:
    assert validate(str(MANY), "--nvrx", "0.4.1", "--strict").exit_code == 2


def test_json_report_of_an_invalid_file() -> None:
    result = validate(str(MANY), "--nvrx", "0.4.1", "--json")
    assert result.exit_code == 2
    assert result.stderr == ""
    report = json.loads(result.stdout)
    assert list(report) == ["source", "valid", "nvrx", "errors", "warnings", "findings"]
    assert report["source"] == str(MANY)
    assert report["valid"] is False
    assert report["nvrx"] == "0.4.1"
    assert (report["errors"], report["warnings"]) == (9, 1)
    # The library's findings, with the relative [checkpoint] dir resolved as `run` reads it.
    expected = resolve_relative(validate_file(MANY, nvrx=NvrxVersion.parse("0.4.1")), Path.cwd()).findings
    assert report["findings"] == [f.to_dict() for f in expected]
    assert report["findings"][0] == {
        "severity": "error",
        "code": "dns-name",
        "table": "job",
        "key": "name",
        "rule": "must be a DNS label: at most 63 lowercase letters, digits and '-', "
        "starting and ending with a letter or digit",
        "fix": 'e.g. name = "many-problems"',
        "value": '"Many Problems"',
        "file": str(MANY),
        "line": 3,
        "column": 1,
        "where": "[job] name",
    }


def test_json_report_of_a_valid_file() -> None:
    result = validate("--json", "--nvrx", "0.4.1")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "source": "<built-in demo policy>",
        "valid": True,
        "nvrx": "0.4.1",
        "errors": 0,
        "warnings": 0,
        "findings": [],
    }


def test_json_with_warnings_and_strict() -> None:
    result = validate(str(WARNINGS), "--nvrx", "0.4.1", "--json", "--strict")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert (report["valid"], report["errors"], report["warnings"]) == (True, 0, 3)
    assert [f["code"] for f in report["findings"]] == ["no-recovery", "checkpoint-never", "fault-duplicate"]
    assert validate(str(WARNINGS), "--nvrx", "0.4.1", "--json").exit_code == 0


def test_json_of_an_unreadable_file(tmp_path: Path) -> None:
    result = validate(str(tmp_path / "nope.toml"), "--json", "--nvrx", "0.4.1")
    assert result.exit_code == 2
    report = json.loads(result.stdout)
    assert (report["valid"], report["errors"], report["nvrx"]) == (False, 1, None)
    assert report["findings"][0]["rule"] == "file not found"


@pytest.mark.parametrize("value", ["banana", "", "latest", "x.y"])
def test_bad_nvrx_value(value: str) -> None:
    result = validate("--nvrx", value)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"nvtrain: error: --nvrx {value!r} is not a version\n  fix: give a version such as 0.4.1 or 0.7.0\n"
    )


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    result = validate(str(path), "--nvrx", "0.4.1")
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == f"nvtrain: {path}: 1 error"
    assert lines[2] == "      file not found"
    assert lines[3].startswith("      fix: check the path")


def test_fixes_only_name_commands_that_exist(tmp_path: Path) -> None:
    # Today a missing file's fix says "run `nvtrain init` to write a starter policy", and there
    # is no `init` command.
    result = validate(str(tmp_path / "nope.toml"), "--nvrx", "0.4.1")
    commands = {c.name for c in app.registered_commands}
    mentioned = set(re.findall(r"`nvtrain ([a-z-]+)", result.stderr))
    assert mentioned <= commands


def test_directory(tmp_path: Path) -> None:
    result = validate(str(tmp_path), "--nvrx", "0.4.1")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[2:] == [
        "      is a directory, not a file",
        "      fix: give the path of the .toml file inside it",
    ]


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # chmod 000 does not stop root, so the denial is simulated.
    path = write(tmp_path, MINIMAL)
    real = os.open

    def deny(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(file) == path:  # the policy is opened with os.open (without blocking)
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    result = validate(str(path), "--nvrx", "0.4.1")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[2:] == [
        "      permission denied",
        "      fix: make the file readable by this user",
    ]


def test_path_below_a_file(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL) / "child.toml"
    result = validate(str(path), "--nvrx", "0.4.1")
    assert result.exit_code == 2
    assert "      cannot be read (Not a directory)" in result.stderr.splitlines()


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[job]\nname = "caf\xe9"\n')
    result = validate(str(path), "--nvrx", "0.4.1")
    assert result.exit_code == 2
    assert f"  {path}:2: error (top level)\n      is not UTF-8 text (byte 17 is 0xe9)\n" in result.stderr


def test_timings_findings_name_the_timings_file(tmp_path: Path) -> None:
    timings = write(tmp_path, 'step = "1s"\nsave_block = "fast"\n', "timings.toml")
    result = validate("--nvrx", "0.4.1", "--timings", str(timings))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"nvtrain: <built-in demo policy> with timings {timings}: 1 error",
        f'  {timings}:2:1: error (top level) save_block = "fast"',
        "      is not a duration",
        '      fix: write a number of seconds or a string such as "90s", "15m", "1h30m" or "250ms"',
    ]


def test_timings_rules(tmp_path: Path) -> None:
    timings = write(tmp_path, 'step = { median = "2s", max = "25s" }\n', "timings.toml")
    result = validate("--nvrx", "0.4.1", "--timings", str(timings), "--json")
    assert result.exit_code == 2
    found = [(f["severity"], f["code"], f["where"]) for f in json.loads(result.stdout)["findings"]]
    assert found == [
        ("error", "timeout-measured", "[heartbeat] timeout"),
        ("error", "timeout-measured", "[restart.in_process] soft_timeout"),
    ]


def test_missing_timings_file(tmp_path: Path) -> None:
    missing = tmp_path / "timings.json"
    result = validate("--nvrx", "0.4.1", "--timings", str(missing))
    assert result.exit_code == 2
    assert f"  {missing}: error (top level)\n      file not found\n" in result.stderr


def test_integer_too_large_for_a_duration(tmp_path: Path) -> None:
    # tomllib reads integers of any size; today float() of this one raises OverflowError.
    path = write(tmp_path, MINIMAL + "collective_timeout = 1" + "0" * 400 + "\n")
    result = validate(str(path), "--nvrx", "0.4.1")
    assert result.exit_code == 2
    assert f"  {path}:4:1: error [job] collective_timeout" in result.stderr

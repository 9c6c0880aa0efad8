"""A policy or timings file that starts with a UTF-8 byte order mark (as some Windows editors
save them) reads as if it had none: ``validate`` and ``run --dry-run`` accept it, and findings
keep the lines and columns that an editor shows."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from nvtrain.cli import app

UTF8_BOM = b"\xef\xbb\xbf"

runner = CliRunner()


def invoke(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def write(path: Path, text: str) -> Path:
    path.write_bytes(UTF8_BOM + text.encode("utf-8"))
    return path


def policy_text(tmp_path: Path, extra: str = "") -> str:
    return f'[job]\nname = "bom"\nscript = "train.py"\n{extra}[checkpoint]\ndir = "{tmp_path / "ckpt"}"\n'


def test_validate_and_run_accept_a_policy_with_a_bom(tmp_path: Path) -> None:
    policy = write(tmp_path / "policy.toml", policy_text(tmp_path))
    result = invoke("validate", str(policy), "--nvrx", "0.4.1")
    assert result.exit_code == 0, result.output
    assert f"{policy} is valid" in result.stdout
    plan = invoke("run", str(policy), "--dry-run", "--run-id", "bom-1")
    assert plan.exit_code == 0, plan.output
    assert json.loads(plan.stdout)["env"]["NVTRAIN_RUN_ID"] == "bom-1"


def test_findings_in_a_policy_with_a_bom_keep_their_positions(tmp_path: Path) -> None:
    text = policy_text(tmp_path, extra="nproc_per_node = two\n")
    plain = tmp_path / "plain.toml"
    plain.write_text(text, encoding="utf-8")
    with_bom = write(tmp_path / "bom.toml", text)
    # a syntax error on line 4, column 18 (the bare word), with and without the BOM
    results = [invoke("validate", str(path), "--nvrx", "0.4.1") for path in (plain, with_bom)]
    assert [r.exit_code for r in results] == [2, 2]
    assert f"{plain}:4:18: error" in results[0].stderr
    assert results[1].stderr == results[0].stderr.replace(str(plain), str(with_bom))
    # an error on line 1: its column is the editor's (the BOM is not a character there)
    first = write(tmp_path / "first.toml", "nam = 1\n" + policy_text(tmp_path))
    result = invoke("validate", str(first), "--nvrx", "0.4.1")
    assert result.exit_code == 2 and f"{first}:1:1: error (top level) nam" in result.stderr
    plan = invoke("run", str(with_bom), "--dry-run")
    assert plan.exit_code == 2 and f"{with_bom}:4:18: error" in plan.stderr


def test_timings_files_with_a_bom_read(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(policy_text(tmp_path), encoding="utf-8")
    toml = write(tmp_path / "timings.toml", 'step = "1.5s"\n[save_block]\nmedian = "2s"\n')
    as_json = write(tmp_path / "timings.json", '{"step": "1.5s", "save_block": {"median": "2s"}}')
    for timings in (toml, as_json):
        result = invoke("validate", str(policy), "--nvrx", "0.4.1", "--timings", str(timings), "--json")
        findings = json.loads(result.stdout)["findings"]
        assert [f for f in findings if f["file"] == str(timings)] == [], findings

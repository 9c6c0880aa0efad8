"""Outputs never replace a file of another kind: ``report --timeline`` writes only a ``.png``
path that is not there or holds a PNG, ``schema -o`` only a ``.json`` path that is not there or
holds a JSON Schema (a policy given by mistake is refused, exit 2, and left as it was). Each
output is written whole: a write that fails half-way leaves the file that was there."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from nvtrain.cli import app
from nvtrain.config.reference import schema_json

ROOT = Path(__file__).resolve().parents[2]
CPU_LOG = ROOT / "tests/tuning/data/cpu-demo-events.jsonl"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
POLICY = '[job]\nname = "mine"\nscript = "train.py"\n'

runner = CliRunner()


def invoke(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY, encoding="utf-8")
    return path


def test_report_timeline_refuses_a_policy(policy: Path, tmp_path: Path) -> None:
    result = invoke("report", str(CPU_LOG), "--timeline", str(policy))
    assert result.exit_code == 2
    assert result.stderr == (
        f"nvtrain: error: --timeline {policy}: the file written is a PNG image, "
        "so its name must end in .png\n"
        "  fix: choose a .png path, e.g. --timeline policy.png\n"
    )
    # a policy (or anything but a PNG) under a .png name is refused too
    disguised = tmp_path / "policy.png"
    disguised.write_text(POLICY, encoding="utf-8")
    result = invoke("report", str(CPU_LOG), "--timeline", str(disguised))
    assert result.exit_code == 2
    assert f"--timeline {disguised} exists and is not a PNG image: writing would replace it" in result.stderr
    assert f"fix: choose another --timeline path, or move {disguised} away first" in result.stderr
    assert policy.read_text(encoding="utf-8") == POLICY and disguised.read_text(encoding="utf-8") == POLICY
    assert result.stdout == ""


def test_report_timeline_replaces_a_png_and_writes_a_new_one(tmp_path: Path) -> None:
    png = tmp_path / "timeline.PNG"
    assert invoke("report", str(CPU_LOG), "--timeline", str(png)).exit_code == 0
    first = png.read_bytes()
    assert first[:8] == PNG_SIGNATURE
    png.write_bytes(PNG_SIGNATURE + b"an older timeline")
    assert invoke("report", str(CPU_LOG), "--timeline", str(png)).exit_code == 0
    assert png.read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline.PNG"]  # no temporary file left
    folder = tmp_path / "folder.png"
    folder.mkdir()
    result = invoke("report", str(CPU_LOG), "--timeline", str(folder))
    assert result.exit_code == 2 and f"--timeline {folder} is a folder" in result.stderr


def test_schema_output_refuses_a_policy(policy: Path, tmp_path: Path) -> None:
    result = invoke("schema", "-o", str(policy))
    assert result.exit_code == 2
    assert result.stderr == (
        f"nvtrain: error: --output {policy}: the file written is a JSON Schema, "
        "so its name must end in .json\n"
        "  fix: choose a .json path, e.g. --output policy.json\n"
    )
    disguised = tmp_path / "policy.json"
    disguised.write_text(POLICY, encoding="utf-8")
    other_json = tmp_path / "package.json"
    other_json.write_text('{"name": "not a schema"}', encoding="utf-8")
    for target in (disguised, other_json):
        result = invoke("schema", "-o", str(target))
        assert result.exit_code == 2
        assert f"--output {target} exists and is not a JSON Schema: writing would replace it" in result.stderr
    assert policy.read_text(encoding="utf-8") == POLICY and disguised.read_text(encoding="utf-8") == POLICY
    # a schema written before is replaced
    schema = tmp_path / "policy.schema.json"
    schema.write_text('{"$schema": "https://json-schema.org/draft/2020-12/schema"}', encoding="utf-8")
    assert invoke("schema", "-o", str(schema)).exit_code == 0
    assert schema.read_text(encoding="utf-8") == schema_json()


def _limit_file_size(limit: int) -> None:
    """In the child: files it writes stop growing at ``limit`` bytes (the write fails with
    EFBIG, as on a full disk, rather than SIGXFSZ killing it)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def nvtrain_limited(limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvtrain", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lambda: _limit_file_size(limit),
    )


@pytest.mark.parametrize("command", ["schema", "report"])
def test_a_write_that_fails_half_way_leaves_the_old_file(tmp_path: Path, command: str) -> None:
    if command == "schema":
        target = tmp_path / "policy.schema.json"
        old = b'{"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "the old one"}'
        args = ["schema", "-o", str(target)]
    else:
        pytest.importorskip("matplotlib")
        target = tmp_path / "timeline.png"
        old = PNG_SIGNATURE + b"the old timeline"
        args = ["report", str(CPU_LOG), "--timeline", str(target)]
    target.write_bytes(old)
    result = nvtrain_limited(4096, *args)  # the schema and the PNG are both larger
    assert result.returncode == 2, result.stderr
    assert "File too large" in result.stderr and "Traceback" not in result.stderr
    assert target.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]

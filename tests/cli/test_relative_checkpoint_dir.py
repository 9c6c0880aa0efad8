"""A relative ``[checkpoint] dir`` means "here" (issue 39): ``nvtrain validate`` accepts it as
``nvtrain run`` does, resolved against the folder the command started in by one library function
(``config.paths.resolve_relative``), and shows the resolved path; what is read for a pod's
manifest still needs an absolute path (a volume's ``mountPath``).

The real run with a relative folder: tests/launcher/test_run_low_items.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.config import validate_file
from nvtrain.config.paths import relative_checkpoint_dir, resolve_path, resolve_relative

runner = CliRunner()

POLICY = '[job]\nname = "rel"\nscript = "x.py"\n[checkpoint]\ndir = "./ckpt/../ckpts"\n'


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A policy with a relative ``[checkpoint] dir`` one folder up; the commands start in ``work``."""
    (tmp_path / "rel.toml").write_text(POLICY, encoding="utf-8")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    for name in ("KUBERNETES_SERVICE_HOST", "JOB_COMPLETION_INDEX", "SLURM_JOB_ID", "SLURM_NODEID"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "work"


def test_validate_accepts_it_and_shows_where_run_will_write(work: Path) -> None:
    result = runner.invoke(app, ["validate", "--strict", "--json", "../rel.toml"])
    assert result.exit_code == 0, result.output  # an info, not a warning: --strict passes
    (finding,) = json.loads(result.stdout)["findings"]
    assert (finding["severity"], finding["code"], finding["where"], finding["line"]) == (
        "info",
        "checkpoint-dir",
        "[checkpoint] dir",
        5,
    )
    assert finding["value"] == '"./ckpt/../ckpts"'
    assert finding["rule"].endswith(f", here {work / 'ckpts'}"), finding
    # The same folder as `nvtrain run` from here: its run folder is <that>/<run id>.
    plan = runner.invoke(app, ["run", "--dry-run", "--run-id", "r-1", "../rel.toml"])
    assert plan.exit_code == 0, plan.output
    assert Path(json.loads(plan.stdout)["env"]["NVTRAIN_EVENTS"]).parent == work / "ckpts" / "r-1"
    shown = runner.invoke(app, ["validate", "../rel.toml"])
    assert shown.exit_code == 0, shown.output
    # The console cuts lines at its width (80 columns off a terminal) with "...": a long tmp path
    # (pytest-xdist's) is shown cut, so compare what is shown with the start of the path.
    (line,) = [x.strip() for x in shown.stdout.splitlines() if x.strip().startswith("[checkpoint] dir = ")]
    value = line.removeprefix("[checkpoint] dir = ").removesuffix("  (default)")
    expected = f'"{work / "ckpts"}"'
    assert value == expected or (value.endswith("...") and expected.startswith(value[:-3])), line


def test_other_errors_are_still_reported_and_a_manifest_still_needs_an_absolute_path(work: Path) -> None:
    policy = work.parent / "rel.toml"
    policy.write_text(POLICY + "keep = 1\n", encoding="utf-8")
    result = runner.invoke(app, ["validate", "--json", str(policy)])
    assert result.exit_code == 2, result.output
    found = [(f["severity"], f["code"]) for f in json.loads(result.stdout)["findings"]]
    assert found == [("info", "checkpoint-dir"), ("error", "checkpoint-keep")], found
    # The library's validation (what the manifest checks and `load_policy` read) resolves nothing.
    policy.write_text(POLICY, encoding="utf-8")
    strict = validate_file(policy, nvrx=None)
    assert [(f.severity, f.code) for f in strict.findings] == [("error", "checkpoint-dir")]


@pytest.mark.parametrize("folder", ["", "/abs/ckpt", "bad\0dir"])
def test_only_a_usable_relative_path_is_resolved(tmp_path: Path, folder: str) -> None:
    """Empty, absolute and NUL-holding values stay as the checks judge them (an error for ``""``
    and a NUL, nothing for an absolute path)."""
    path = tmp_path / "p.toml"
    written = json.dumps(folder)  # a TOML basic string: "bad\u0000dir"
    path.write_text(f'[job]\nname = "p"\nscript = "x.py"\n[checkpoint]\ndir = {written}\n', encoding="utf-8")
    result = validate_file(path, nvrx=None)
    assert relative_checkpoint_dir(result.data) is None
    assert resolve_relative(result, tmp_path) is result


def test_resolve_path() -> None:
    here = Path("/work/job")
    assert resolve_path("ckpt", here) == "/work/job/ckpt"
    assert resolve_path("./a/../b/", here) == "/work/job/b"
    assert resolve_path("../up", here) == "/work/up"
    assert resolve_path("/abs//kept", here) == "/abs//kept"  # an absolute path stays as written

"""What importing and running the command loads: never torch or NVRx for validate and --help,
never typer or rich from the library, and rich only in cli/render/."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nvtrain

SRC = Path(nvtrain.__file__).resolve().parent
INVALID = Path(__file__).resolve().parents[1] / "config" / "policies" / "invalid" / "many_problems.toml"
EVENTS_LOG = Path(__file__).resolve().parent.parent / "tuning" / "data" / "cpu-demo-events.jsonl"
HEAVY = ("torch", "nvidia_resiliency_ext")


def run_python(code: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_validate_and_help_do_not_import_torch_or_nvrx() -> None:
    report = run_python(
        f"""
        import json, sys
        from typer.testing import CliRunner
        from nvtrain.cli import app

        runner = CliRunner()
        codes = [
            runner.invoke(app, ["validate"]).exit_code,
            runner.invoke(app, ["validate", "--nvrx", "0.7.0"]).exit_code,
            runner.invoke(app, ["validate", {str(INVALID)!r}, "--nvrx", "0.4.1"]).exit_code,
            runner.invoke(app, ["validate", {str(INVALID)!r}, "--json"]).exit_code,
            runner.invoke(app, ["--help"]).exit_code,
            runner.invoke(app, ["validate", "--help"]).exit_code,
            runner.invoke(app, ["schema"]).exit_code,
            runner.invoke(app, ["validate", "--nvrx", "0.4.1", "--timings", {str(EVENTS_LOG)!r}]).exit_code,
        ]
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print(json.dumps({{"codes": codes, "heavy": heavy}}))
        """
    )
    assert report == {"codes": [0, 0, 2, 2, 0, 0, 0, 0], "heavy": []}


def test_library_does_not_import_the_cli_stack() -> None:
    report = run_python(
        """
        import json, sys
        import nvtrain, nvtrain.errors, nvtrain.nvrx, nvtrain.kube
        import nvtrain.config, nvtrain.config.checks, nvtrain.config.duration, nvtrain.findings
        import nvtrain.config.load, nvtrain.config.locate, nvtrain.config.reference
        import nvtrain.config.schema, nvtrain.config.validation
        import nvtrain.tuning, nvtrain.config.timings
        from nvtrain.config import validate_file
        from nvtrain.nvrx import NvrxVersion

        validate_file(None)
        validate_file(None, nvrx=NvrxVersion.parse("0.7.0"))
        loaded = sorted(
            m for m in sys.modules
            if m.split(".")[0] in ("typer", "rich", "click", "torch", "nvidia_resiliency_ext")
        )
        print(json.dumps({"loaded": loaded, "cli": "nvtrain.cli" in sys.modules}))
        """
    )
    assert report == {"loaded": [], "cli": False}


_RICH = re.compile(r"^\s*(import rich\b|from rich\b)", re.MULTILINE)
_TYPER = re.compile(r"^\s*(import typer\b|from typer\b)", re.MULTILINE)


def _importers(pattern: re.Pattern[str]) -> set[str]:
    return {
        path.relative_to(SRC).as_posix()
        for path in SRC.rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    }


def test_rich_is_imported_only_in_the_render_package() -> None:
    importers = _importers(_RICH)
    assert importers  # the pattern finds rich's imports
    assert all(name.startswith("cli/render/") for name in importers), importers


def test_typer_is_imported_only_in_the_cli_package() -> None:
    importers = _importers(_TYPER)
    assert importers
    assert all(name.startswith("cli/") for name in importers), importers


def test_validate_into_a_pipe_does_not_load_rich(tmp_path: Path) -> None:
    """Plain output for logs and pipes: rich (and its start-up cost) is not imported."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "nvtrain", "validate", "--nvrx", "0.4.1"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "nvtrain.cli.render.settings" in imported  # what prints the policy, without rich
    assert not {m for m in imported if m == "rich" or m.startswith("rich.")}
    assert "[job] name = " in result.stdout

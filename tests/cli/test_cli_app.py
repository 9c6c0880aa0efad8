"""The ``nvtrain`` app: help, version and ``nvtrain schema``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nvtrain import __version__
from nvtrain.cli import COMMANDS, app, app_for
from nvtrain.config.reference import schema_json

runner = CliRunner()


def test_help() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert result.stderr == ""
    assert "Usage: nvtrain [OPTIONS] COMMAND [ARGS]..." in result.stdout
    assert "Commands:" in result.stdout
    listed = re.findall(r"^  ([a-z-]+) +\S", result.stdout.split("Commands:")[1], re.MULTILINE)
    assert (
        listed
        == list(COMMANDS)
        == ["run", "validate", "schema", "tune-interval", "init", "manifest", "report", "control", "env"]
    )
    assert "  validate       Check a policy: every problem at once" in result.stdout
    assert "--version" in result.stdout
    assert "\x1b[" not in result.stdout and "│" not in result.stdout  # plain text, no rich boxes
    assert runner.invoke(app, ["-h"]).stdout == result.stdout


def test_no_arguments_shows_help_and_exits_2() -> None:
    result = runner.invoke(app, [])
    assert result.exit_code == 2
    assert "Usage: nvtrain [OPTIONS] COMMAND [ARGS]..." in result.output


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"nvtrain {__version__}\n" == "nvtrain 0.1.0\n"


def test_unknown_command_is_a_usage_error() -> None:
    result = runner.invoke(app, ["frobnicate"])
    assert result.exit_code == 2
    assert "No such command 'frobnicate'" in result.stderr


def test_validate_help() -> None:
    result = runner.invoke(app, ["validate", "--help"])
    assert result.exit_code == 0
    text = result.stdout
    assert "Usage: nvtrain validate [OPTIONS] [policy]" in text
    for option in ("--timings", "--nvrx", "--strict", "--json", "--help"):
        assert option in text
    assert "Exit 0 when valid, 2 on errors, 1 on warnings with --strict." in text
    assert "Default: the built-in demo policy." in text


def test_schema_help() -> None:
    result = runner.invoke(app, ["schema", "--help"])
    assert result.exit_code == 0
    assert "--output" in result.stdout
    assert "Print the policy's JSON Schema." in result.stdout


# The first line of each command's docstring, and options its help must list.
COMMAND_HELP = {
    "run": ("Run the training job of POLICY on this node under ft_launcher", ["--dry-run", "--run-id"]),
    "validate": ("Check a policy: every problem at once", ["--timings", "--nvrx", "--strict", "--json"]),
    "schema": ("Print the policy's JSON Schema.", ["--output"]),
    "tune-interval": ("Recommend a checkpoint interval", ["--json"]),
    "init": ("Write policy.toml", []),
    "manifest": ("Render the Kubernetes objects of POLICY as YAML", []),
    "report": ("Report a run from its events log", []),
    "control": ("Host the job's rendezvous store in this pod", ["--dry-run"]),
    "env": ("Show the versions of nvtrain, Python, torch, NVRx and the frameworks", ["--json", "--no-torch"]),
}


def test_every_command_has_its_help_checked() -> None:
    assert set(COMMAND_HELP) == set(COMMANDS)


@pytest.mark.parametrize("command", list(COMMAND_HELP))
def test_command_help(command: str) -> None:
    summary, options = COMMAND_HELP[command]
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    text = result.stdout
    assert text.startswith(f"Usage: nvtrain {command} [OPTIONS]")
    assert summary in " ".join(text.split())
    for option in [*options, "-h, --help"]:
        assert option in text
    assert runner.invoke(app, [command, "-h"]).stdout == text


@pytest.mark.parametrize("command", list(COMMAND_HELP))
def test_the_one_command_app_behaves_as_the_whole_app(command: str) -> None:
    """`nvtrain COMMAND ...` runs an app built with that command only (start-up time)."""
    one = app_for([command, "--help"])
    assert one is not app
    assert runner.invoke(one, [command, "--help"]).stdout == runner.invoke(app, [command, "--help"]).stdout
    bad = runner.invoke(one, [command, "--no-such-option"])
    assert bad.exit_code == 2
    assert bad.stderr == runner.invoke(app, [command, "--no-such-option"]).stderr


@pytest.mark.parametrize("args", [[], ["--help"], ["--version"], ["frobnicate"], ["-h", "validate"]])
def test_anything_but_a_command_first_gets_the_whole_app(args: list[str]) -> None:
    assert app_for(args) is app


# ---------------------------------------------------------------------------------------------
# nvtrain schema


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        return schema["$defs"][name]  # type: ignore[no-any-return]
    return node


def test_schema_is_json_with_every_table() -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    assert result.stdout == schema_json()
    schema = json.loads(result.stdout)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "nvtrain policy"
    assert schema["required"] == ["job"]
    assert set(schema["properties"]) == {
        "job",
        "rendezvous",
        "heartbeat",
        "restart",
        "checkpoint",
        "metrics",
        "faults",
    }
    checkpoint = _resolve(schema, schema["properties"]["checkpoint"])
    assert "async" in checkpoint["properties"]
    assert "async_" not in checkpoint["properties"]
    assert checkpoint["properties"]["async"]["type"] == "boolean"
    restart = _resolve(schema, schema["properties"]["restart"])
    assert set(restart["properties"]) == {"escalate_after", "in_process", "in_job"}
    fault = _resolve(schema, schema["properties"]["faults"]["items"])
    assert fault["required"] == ["step", "rank", "kind"]


def test_schema_forbids_unknown_keys_everywhere() -> None:
    schema = json.loads(runner.invoke(app, ["schema"]).stdout)
    assert schema["additionalProperties"] is False
    assert schema["$defs"]
    for name, definition in schema["$defs"].items():
        assert definition["additionalProperties"] is False, name


def test_schema_to_a_file(tmp_path: Path) -> None:
    target = tmp_path / "policy.schema.json"
    result = runner.invoke(app, ["schema", "--output", str(target)])
    assert result.exit_code == 0
    assert result.stdout == ""
    assert target.read_text(encoding="utf-8") == schema_json()
    again = runner.invoke(app, ["schema", "-o", str(target)])
    assert again.exit_code == 0


def test_schema_to_an_unwritable_path_is_a_clear_error(tmp_path: Path) -> None:
    # Today the OSError escapes: exit 1 and a traceback.
    result = runner.invoke(app, ["schema", "-o", str(tmp_path / "missing-dir" / "schema.json")])
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert str(tmp_path / "missing-dir" / "schema.json") in result.stderr

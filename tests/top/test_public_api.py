"""The public surface: changing it must be a decision, so these lists are pinned."""

from __future__ import annotations

import nvtrain.config
import nvtrain.errors
from nvtrain.cli import app
from nvtrain.errors import ExitCode, signal_exit_code


def test_config_api() -> None:
    assert nvtrain.config.__all__ == [
        "Finding",
        "Policy",
        "Setting",
        "Validation",
        "effective_settings",
        "format_duration",
        "load_policy",
        "parse_duration",
        "validate_file",
        "validate_source",
    ]
    for name in nvtrain.config.__all__:
        assert getattr(nvtrain.config, name) is not None


def test_errors_api() -> None:
    assert nvtrain.errors.__all__ == [
        "ConfigError",
        "ExitCode",
        "NvtrainError",
        "UsageError",
        "signal_exit_code",
    ]
    assert issubclass(nvtrain.errors.ConfigError, nvtrain.errors.NvtrainError)
    assert issubclass(nvtrain.errors.UsageError, nvtrain.errors.NvtrainError)


def test_exit_codes() -> None:
    assert {c.name: int(c) for c in ExitCode} == {
        "OK": 0,
        "FAILED": 1,
        "USAGE": 2,
        "RENDEZVOUS": 3,
        "ESCALATED": 4,
    }
    assert signal_exit_code(15) == 143
    assert nvtrain.errors.UsageError("m").exit_code == 2
    assert nvtrain.errors.NvtrainError().exit_code == 1


def test_cli_commands() -> None:
    assert [c.name for c in app.registered_commands] == [
        "run",
        "validate",
        "schema",
        "tune-interval",
        "init",
        "manifest",
        "report",
        "control",
        "env",
    ]


def test_version() -> None:
    assert nvtrain.__all__ == ["__version__"]
    assert nvtrain.__version__ == "0.1.0"

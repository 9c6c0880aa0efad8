"""The one place where library errors become messages and exit codes."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer

from nvtrain.cli import _interrupt
from nvtrain.errors import ConfigError, NvtrainError

P = ParamSpec("P")
R = TypeVar("R")


def exit_on_error(command: Callable[P, R]) -> Callable[P, R]:
    """Run ``command``; an ``NvtrainError`` is printed to stderr and ends it with its exit code,
    and Ctrl-C (``KeyboardInterrupt``) with one line and exit 130."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            _interrupt.say_interrupted()
            raise typer.Exit(_interrupt.INTERRUPTED) from None
        except NvtrainError as exc:
            from nvtrain.cli.render.findings import print_error, print_findings

            if isinstance(exc, ConfigError):
                print_findings(exc.source, exc.findings)
            else:
                print_error(exc)
            raise typer.Exit(int(exc.exit_code)) from None
        except Exception:
            if _interrupt.received():  # e.g. pydantic's SchemaError around a KeyboardInterrupt
                _interrupt.say_interrupted()
                raise typer.Exit(_interrupt.INTERRUPTED) from None
            raise

    return wrapper

"""The ``nvtrain`` command: one small module per subcommand over the library.

Library errors become messages and exit codes in ``_errors.py`` only; rich is imported in
``render/`` only. Heavy imports happen inside the commands so ``--help`` stays fast.
"""

from __future__ import annotations

import gc
import os
import sys

try:  # most of the command's start-up: Ctrl-C here is exit 130 too, not a traceback
    from collections.abc import Callable, Iterable, Sequence
    from typing import Annotated

    import typer

    from nvtrain import __version__
    from nvtrain.cli import (
        _interrupt,
        control,
        env,
        init,
        manifest,
        report,
        run,
        schema,
        tune_interval,
        validate,
    )
except KeyboardInterrupt:
    # What _interrupt.interrupted() does; that module may be the one whose import was stopped.
    sys.stderr.write("nvtrain: interrupted (SIGINT)\n")
    sys.stderr.flush()
    os._exit(130)

__all__ = ["app", "main"]

COMMANDS: dict[str, Callable[..., None]] = {
    "run": run.command,
    "validate": validate.command,
    "schema": schema.command,
    "tune-interval": tune_interval.command,
    "init": init.command,
    "manifest": manifest.command,
    "report": report.command,
    "control": control.command,
    "env": env.command,
}
"""Every command, in the order ``--help`` lists them."""


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"nvtrain {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Fault-tolerant launcher for distributed PyTorch training on Kubernetes (built on NVRx).

    Exit codes: 0 ok; 1 training failed (or warnings with validate --strict); 2 bad usage or
    invalid policy; 3 peers not found in time; 4 the same fault repeats; 128+N stopped by signal N.
    """


def make_app(names: Iterable[str] = COMMANDS) -> typer.Typer:
    """The ``nvtrain`` app with the commands ``names`` (all of them by default)."""
    made = typer.Typer(
        name="nvtrain",
        help="Fault-tolerant launcher for distributed PyTorch training on Kubernetes (built on NVRx).",
        no_args_is_help=True,
        # Plain click help: no rich import (--help in ~0.1 s instead of ~0.3 s), same content.
        rich_markup_mode=None,
        pretty_exceptions_show_locals=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    made.callback()(_root)
    for name in names:
        # `run` cuts its command line after the training script: what follows is the script's.
        made.command(name, cls=run.RunCommand if name == "run" else None)(COMMANDS[name])
    return made


app = make_app()


def app_for(args: Sequence[str]) -> typer.Typer:
    """The app to run ``nvtrain ARGS`` with: when ARGS start with a command, one with only that
    command. typer reads the signature and type hints of every command it holds before it
    parses anything (~25 ms of `nvtrain validate`'s start-up); the others are never needed.
    Anything else (no command, an option first, an unknown command, shell completion, which
    passes no arguments) gets the whole app, so its help and error messages are unchanged."""
    if args and args[0] in COMMANDS:
        return make_app([args[0]])
    return app


def main() -> None:
    """Entry point of the ``nvtrain`` script and of ``python -m nvtrain``."""
    try:
        with _interrupt.watch():
            try:
                app_for(sys.argv[1:])()
            except SystemExit as exc:
                if exc.code == _interrupt.INTERRUPTED and _interrupt.received():
                    _interrupt.interrupted()  # typer ends a Ctrl-C while parsing silently
                raise
            except Exception:
                if _interrupt.received():  # a library turned the KeyboardInterrupt into its own error
                    _interrupt.interrupted()
                raise
    except KeyboardInterrupt:  # outside a command (inside one, ``exit_on_error`` answers)
        _interrupt.interrupted()
    finally:
        # The process ends here. Interpreter shutdown runs full garbage collections over all
        # that was imported (~30,000 objects with typer and pydantic): 50-80 ms of `nvtrain
        # validate` on a 2-core machine (BENCHMARKS.md). They skip frozen objects; the memory
        # is the OS's to reclaim, and files are closed by their commands, not by collection.
        gc.freeze()

"""The ``nvtrain`` command: one small module per subcommand over the library.

Library errors become messages and exit codes in ``_errors.py`` only; rich is imported in
``_console.py`` only. Heavy imports happen inside the commands so ``--help`` stays fast.
"""

from __future__ import annotations

from typing import Annotated

import typer

from nvtrain import __version__
from nvtrain.cli import init, manifest, report, run, schema, tune_interval, validate

__all__ = ["app", "main"]

app = typer.Typer(
    name="nvtrain",
    help="Fault-tolerant launcher for distributed PyTorch training on Kubernetes (built on NVRx).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"nvtrain {__version__}")
        raise typer.Exit()


@app.callback()
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


app.command("run")(run.command)
app.command("validate")(validate.command)
app.command("schema")(schema.command)
app.command("tune-interval")(tune_interval.command)
app.command("init")(init.command)
app.command("manifest")(manifest.command)
app.command("report")(report.command)


def main() -> None:
    """Entry point of the ``nvtrain`` script and of ``python -m nvtrain``."""
    app()

"""``nvtrain schema``: the policy's JSON Schema, for editors that complete TOML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nvtrain.cli._errors import exit_on_error
from nvtrain.errors import UsageError


@exit_on_error
def command(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE", help="Write to FILE instead of stdout."),
    ] = None,
) -> None:
    """Print the policy's JSON Schema."""
    from nvtrain.config.reference import schema_json

    text = schema_json()
    if output is None:
        typer.echo(text, nl=False)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(
                f"cannot write {output}: {exc.strerror or exc}",
                "give a path in a directory that exists and is writable",
            ) from None

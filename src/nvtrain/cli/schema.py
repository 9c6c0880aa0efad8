"""``nvtrain schema``: the policy's JSON Schema, for editors that complete TOML."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nvtrain.cli._errors import exit_on_error
from nvtrain.errors import UsageError


@exit_on_error
def command(
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="FILE",
            help="Write to FILE (.json) instead of stdout; an existing FILE is replaced only if "
            "it is a JSON Schema.",
        ),
    ] = None,
) -> None:
    """Print the policy's JSON Schema."""
    from nvtrain.config.reference import schema_json

    text = schema_json()
    if output is None:
        typer.echo(text, nl=False)
    else:
        from nvtrain.atomic import write_atomically
        from nvtrain.cli._paths import check_output

        check_output("--output", output, ".json", "a JSON Schema", _is_schema)
        try:
            write_atomically(output, text.encode("utf-8"))
        except OSError as exc:
            raise UsageError(
                f"cannot write {output}: {exc.strerror or exc}",
                "give a path in a directory that exists and is writable",
            ) from None


def _is_schema(head: bytes) -> bool:
    """Whether ``head`` (a whole file) is a JSON Schema (an object with a ``$schema`` key): one
    written before, which may be replaced."""
    try:
        data = json.loads(head.removeprefix(b"\xef\xbb\xbf"))
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "$schema" in data

"""``nvtrain init``: write a starter policy, training script and Dockerfile."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nvtrain.cli._errors import exit_on_error


@exit_on_error
def command(
    directory: Annotated[
        Path,
        typer.Argument(help="Directory to write into (created if missing).", show_default="."),
    ] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Overwrite starter files that exist.")] = False,
) -> None:
    """Write policy.toml (every key explained), train.py (FSDP2 on synthetic data) and a Dockerfile.

    Refuses to overwrite existing files unless --force (exit 2).
    """
    from nvtrain.cli.render.init import print_init
    from nvtrain.kube.init import init_project, starter_nvrx_version

    written = init_project(directory, force=force)
    print_init(str(directory), [str(p) for p in written], starter_nvrx_version())

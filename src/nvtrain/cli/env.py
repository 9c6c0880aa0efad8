"""``nvtrain env``: the environment nvtrain finds here, for a bug report or a first look."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from nvtrain.cli._errors import exit_on_error


@exit_on_error
def command(
    as_json: Annotated[bool, typer.Option("--json", help="Print it as one JSON object.")] = False,
    no_torch: Annotated[
        bool, typer.Option("--no-torch", help="Do not import torch (no CUDA, GPU or NCCL lines; faster).")
    ] = False,
) -> None:
    """Show the versions of nvtrain, Python, torch, NVRx and the frameworks, what torch sees of
    CUDA and the GPUs, and the platform nvtrain run would take this machine for (Kubernetes pod,
    Slurm task or bare metal). Paste it into a bug report. Exit 0."""
    from nvtrain.launcher.machine import describe

    entries = describe(with_torch=not no_torch)
    if as_json:
        typer.echo(json.dumps({e.key: e.value for e in entries}, indent=2))
        return
    width = max(len(e.key) for e in entries)
    for entry in entries:
        typer.echo(f"{entry.key.replace('_', ' '):<{width}}  {entry.value}")

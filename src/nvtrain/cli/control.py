"""``nvtrain control``: the rendezvous store's pod when ``[rendezvous] store = "control"``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from nvtrain.cli._errors import exit_on_error


@exit_on_error
def command(
    policy: Annotated[Path, typer.Argument(help="Policy file (TOML), the same one the training pods run.")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the store process's plan as JSON and exit.")
    ] = False,
) -> None:
    """Host the job's rendezvous store in this pod (NVRx 0.6+ nvrx-control), supervised.

    For policies with [rendezvous] store = "control": run it in the pod named <job>-control, so
    that no training pod holds the store and losing pod 0 does not stop the others. Exit 0 when
    the job's rendezvous closed; 2 invalid policy or usage; 3 this pod's name did not resolve;
    128+N stopped by signal N; otherwise the store process's exit code.
    """
    from nvtrain.config.validation import load_policy
    from nvtrain.errors import UsageError
    from nvtrain.launcher.control import build_control_plan, run_control
    from nvtrain.launcher.identity import pod_names
    from nvtrain.nvrx import installed_nvrx

    loaded = load_policy(policy)
    version = installed_nvrx()
    if version is None:
        raise UsageError(
            "NVRx (nvidia-resiliency-ext) is not installed in this environment",
            "run `nvtrain control` in the training image (NVRx 0.6 or later)",
        )
    address = os.environ.get("POD_IP", "").strip() or None
    names = pod_names(loaded)
    plan = build_control_plan(loaded, version, python=sys.executable, address=address, names=names)
    if dry_run:
        typer.echo(json.dumps(plan.to_dict(), indent=2))
        return
    from nvtrain.launcher.ports import check_rendezvous_port

    check_rendezvous_port(loaded.rendezvous.port)

    from nvtrain.cli.render.console import visible

    def say(text: str) -> None:
        typer.echo(f"nvtrain control: {visible(text)}", err=True)

    raise typer.Exit(run_control(plan, loaded, os.environ, say=say))

"""``nvtrain run``: the pod entrypoint."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Annotated

import typer

from nvtrain.cli._errors import exit_on_error
from nvtrain.errors import signal_exit_code


@exit_on_error
def command(
    policy: Annotated[
        Path | None,
        typer.Argument(help="Policy file (TOML). Default: the built-in CPU demo job.", show_default=False),
    ] = None,
    script_args: Annotated[
        list[str] | None,
        typer.Argument(help="Extra arguments for the training script (after --).", show_default=False),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the ft_launcher plan as JSON and exit.")
    ] = False,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id", metavar="ID", help="Run id (default: NVTRAIN_RUN_ID; a new one for a one-node job)."
        ),
    ] = None,
) -> None:
    """Run the training job of POLICY on this node under ft_launcher, supervised.

    Exit 0 finished; 1 failed with the restart budget spent; 2 invalid policy or usage; 3 peers
    not found in time; 4 the same fault repeats without progress; 128+N stopped by signal N.
    """
    from nvtrain.config.validation import load_policy
    from nvtrain.launcher.identity import identify
    from nvtrain.launcher.rundir import prepare
    from nvtrain.launcher.supervisor import supervise

    loaded = load_policy(policy)
    identity = identify(loaded, run_id=run_id)
    plan, paths = prepare(loaded, identity, extra_args=tuple(script_args or ()))
    if dry_run:
        typer.echo(json.dumps(plan.to_dict(), indent=2))
        return
    if plan.is_host:
        from nvtrain.launcher.ports import check_rendezvous_port

        check_rendezvous_port(loaded.rendezvous.port)
    from nvtrain.cli import _console

    try:
        outcome = supervise(plan, loaded, identity, paths, report=_console.event_reporter())
    except KeyboardInterrupt:
        raise typer.Exit(signal_exit_code(signal.SIGINT)) from None
    raise typer.Exit(outcome.exit_code)

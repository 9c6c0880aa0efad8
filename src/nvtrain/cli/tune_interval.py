"""``nvtrain tune-interval``: recommend a checkpoint interval from measured (or given) timings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nvtrain.cli._errors import exit_on_error

_TIMINGS = "Timings (durations as in the policy: 90s, 15m, 1h30m, 250ms; given values win)"
_RATE = "Failure rate (--mtbf, or per-GPU and per-node rates)"
_DURATION = "DURATION"


@exit_on_error
def command(
    from_run: Annotated[
        Path | None,
        typer.Option(
            "--from-run",
            metavar="RUN",
            readable=False,  # nvtrain says which file cannot be read, and the fix
            help="Run directory (<checkpoint dir>/<run id>) or one events log: measure the timings.",
            rich_help_panel=_TIMINGS,
        ),
    ] = None,
    step_time: Annotated[
        str | None,
        typer.Option(metavar=_DURATION, help="Time per training step.", rich_help_panel=_TIMINGS),
    ] = None,
    save_block: Annotated[
        str | None,
        typer.Option(
            metavar=_DURATION,
            help="Training blocked per async save (staging).",
            rich_help_panel=_TIMINGS,
        ),
    ] = None,
    save_write: Annotated[
        str | None,
        typer.Option(
            metavar=_DURATION,
            help="Background write per save; a sync save blocks for save-block + save-write.",
            rich_help_panel=_TIMINGS,
        ),
    ] = None,
    restore: Annotated[
        str | None,
        typer.Option(metavar=_DURATION, help="Loading the newest checkpoint.", rich_help_panel=_TIMINGS),
    ] = None,
    restart: Annotated[
        str | None,
        typer.Option(
            metavar=_DURATION,
            help="A failure to training again, not counting the load.",
            rich_help_panel=_TIMINGS,
        ),
    ] = None,
    mtbf: Annotated[
        str | None,
        typer.Option(
            metavar=_DURATION, help="The whole job's mean time between failures.", rich_help_panel=_RATE
        ),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(
            metavar="N", help="GPUs in the job (default: the policy's ranks).", rich_help_panel=_RATE
        ),
    ] = None,
    gpu_mtbf: Annotated[
        str | None,
        typer.Option(metavar=_DURATION, help="Mean time between failures of one GPU.", rich_help_panel=_RATE),
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(metavar="N", help="Nodes in the job (default: the policy's).", rich_help_panel=_RATE),
    ] = None,
    node_mtbf: Annotated[
        str | None,
        typer.Option(
            metavar=_DURATION, help="Mean time between failures of one node.", rich_help_panel=_RATE
        ),
    ] = None,
    policy: Annotated[
        Path | None,
        typer.Option(
            "--policy", metavar="FILE", help="Policy whose interval and async setting to compare against."
        ),
    ] = None,
    write_margin: Annotated[
        float,
        typer.Option(metavar="X", help="Async: time between saves >= X times the median write."),
    ] = 1.5,
    apply: Annotated[
        Path | None,
        typer.Option(
            "--apply", metavar="FILE", help="Write the recommended interval into this policy (only that key)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Recommend a checkpoint interval: Young/Daly, the async write floor, expected efficiency.

    Exit 0 with a recommendation; 2 on bad usage, missing timings or an invalid policy.
    """
    from nvtrain.tuning.advise import Request, tune_interval

    result = tune_interval(
        Request(
            from_run=from_run,
            policy=policy,
            step_time=step_time,
            save_block=save_block,
            save_write=save_write,
            restore=restore,
            restart=restart,
            mtbf=mtbf,
            gpus=gpus,
            gpu_mtbf=gpu_mtbf,
            nodes=nodes,
            node_mtbf=node_mtbf,
            write_margin=write_margin,
            apply=apply,
        )
    )
    from nvtrain.cli.render.findings import print_warnings
    from nvtrain.cli.render.tuning import print_tuning

    if result.measured is not None and result.measured.warnings:
        print_warnings(result.measured.warnings)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    print_tuning(result)

"""``nvtrain report``: goodput, recoveries, rollbacks and checkpoints of a run, from its events log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from nvtrain.cli._errors import exit_on_error
from nvtrain.errors import UsageError

NO_MATPLOTLIB = (
    "no timeline PNG: matplotlib is not installed (pip install 'nvtrain[report]' draws it; "
    "--no-timeline drops this line)"
)


@exit_on_error
def command(
    run_dir: Annotated[
        Path,
        typer.Argument(
            metavar="RUN_DIR",
            readable=False,  # nvtrain says which file cannot be read, and the fix
            help="Run directory (<checkpoint dir>/<run id>) or one of its events-node<N>.jsonl logs.",
            show_default=False,
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    timeline: Annotated[
        Path | None,
        typer.Option(
            "--timeline",
            metavar="PNG",
            help="Write the PNG timeline here (default: report-timeline.png next to the log).",
        ),
    ] = None,
    no_timeline: Annotated[
        bool, typer.Option("--no-timeline", help="Draw no PNG (then matplotlib is not needed).")
    ] = False,
) -> None:
    """Report a run from its events log: training and infrastructure goodput, recovery time per
    fault and per layer, restarts, rollbacks, checkpoints, and a PNG timeline.

    The text (or JSON) is always printed. The PNG is drawn next to the log when matplotlib is
    there and the folder is writable; otherwise one line says why it was not. Exit 0 with a
    report; 2 when the log is missing, unreadable or empty, or the PNG that --timeline asks for
    cannot be drawn.
    """
    from nvtrain.report import TIMELINE_FILE, can_draw, read_report, report_dict, write_timeline

    if timeline is not None and no_timeline:
        raise UsageError("--timeline and --no-timeline cannot be used together", "give one of them")
    report = read_report(run_dir)
    if report.warnings:
        from nvtrain.cli.render.findings import print_warnings

        print_warnings(report.warnings)
    png = None
    if timeline is not None:  # asked for: drawn, or exit 2
        from nvtrain.cli._paths import check_output, refuse_overwrite

        refuse_overwrite("--timeline", timeline, {"the events log": Path(report.source)})
        check_output("--timeline", timeline, ".png", "a PNG image", _is_png)
        png = write_timeline(report, timeline)
    elif not no_timeline:  # drawn where possible; otherwise one line says why not
        from nvtrain.cli.render.findings import print_warnings

        if not can_draw():
            print_warnings([NO_MATPLOTLIB])
        else:
            try:
                png = write_timeline(report, Path(report.source).parent / TIMELINE_FILE)
            except UsageError as exc:
                print_warnings([f"no timeline PNG: {exc.message} ({exc.fix})"])
    if as_json:
        typer.echo(json.dumps(report_dict(report, None if png is None else str(png)), indent=2))
        return
    from nvtrain.cli.render.report import print_report

    print_report(report, png)


def _is_png(head: bytes) -> bool:
    return head.startswith(b"\x89PNG\r\n\x1a\n")

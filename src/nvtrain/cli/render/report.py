"""``nvtrain report``: the run at a glance, as tables on a terminal and whole rows in a pipe."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nvtrain.cli.render.console import escape, make_console, make_table, out

__all__ = ["print_report"]

if TYPE_CHECKING:
    from pathlib import Path

    from rich.table import Table

    from nvtrain.report import Incident, Report, Stats

_MAX_INCIDENT_ROWS = 20
_PIPE_WIDTH = 150
_PHASE_LABELS = {
    "detection": "detection",
    "teardown": "teardown",
    "rendezvous": "rendezvous",
    "start": "start",
    "restore": "restore",
    "first_step": "first step",
}


def _secs(value: float | None) -> str:
    from nvtrain.tuning.interval import short_duration

    return "[dim]–[/]" if value is None else short_duration(value)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _dist(stats: Stats | None, unit: str = "s") -> str:
    """median / p95 / max, in seconds (short durations) or a count of steps."""
    if stats is None:
        return "–"
    if unit == "steps":
        return f"{stats.median:g} / {stats.p95:g} / {stats.max:g} steps"
    return " / ".join(_secs(v) for v in (stats.median, stats.p95, stats.max))


def print_report(report: Report, timeline: Path | None) -> None:
    """The run at a glance: goodput with its definitions, incidents and their recovery phases,
    per-layer distributions, restarts, rollback, freshness, checkpoints."""
    # Logs and pipes get whole rows rather than tables squeezed to 80 columns.
    con = out if out.is_terminal else make_console(highlight=False, soft_wrap=False, width=_PIPE_WIDTH)
    con.print(_headline(report))
    con.print("[bold]Goodput[/]")
    con.print(_goodput_table(report))
    if report.incidents:
        _print_incidents(con, report)
    else:
        con.print("[green]No faults and no restarts.[/]")
    _print_checkpoints(con, report)
    if timeline is not None:
        con.print(f"timeline: {escape(str(timeline))}", soft_wrap=True)
    for note in report.notes:
        con.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def _headline(report: Report) -> str:
    """The run's id, size, length, exit and final step, and the log it was read from."""
    run = f"run {report.run_id}" if report.run_id else "run"
    facts = [f"{report.nodes} node{'s' if report.nodes != 1 else ''}"]
    if report.ranks is not None:
        facts.append(f"{report.ranks} rank{'s' if report.ranks != 1 else ''}")
    facts.append(f"{_secs(report.time.total)} in all")
    facts.append("no launcher_exit" if report.exit_code is None else f"exit {report.exit_code}")
    if report.final_step is not None:
        facts.append(f"final step {report.final_step}")
    return f"[bold]{escape(run)}[/]: {escape(', '.join(facts))}  [dim]{escape(report.source)}[/]"


def _goodput_table(report: Report) -> Table:
    """Training and infrastructure goodput with their definitions, and the job's time split."""
    from rich.table import Table

    from nvtrain.report import INFRASTRUCTURE_GOODPUT, TRAINING_GOODPUT

    split = report.time
    replays = ""
    if report.lost_steps and report.training_goodput_with_replays is not None:
        replays = (
            f"; {_pct(report.training_goodput_with_replays)} if its {report.lost_steps} rolled-back "
            "steps counted (the reference deployment's way)"
        )
    goodput = Table.grid(padding=(0, 2))
    goodput.add_column(no_wrap=True)
    goodput.add_column(justify="right", no_wrap=True)
    goodput.add_column()
    goodput.add_row(
        "training",
        f"[bold]{_pct(report.training_goodput)}[/]",
        f"{report.kept_steps} kept steps, {_secs(report.kept_s)} of training{escape(replays)}\n"
        f"[dim]{escape(TRAINING_GOODPUT)}[/]",
    )
    goodput.add_row(
        "infrastructure",
        f"[bold]{_pct(report.infrastructure_goodput)}[/]",
        f"workers up {_secs(split.up)}\n[dim]{escape(INFRASTRUCTURE_GOODPUT)}[/]",
    )
    goodput.add_row(
        "job time",
        _secs(split.total),
        f"start-up {_secs(split.startup)} · up {_secs(split.up)} · "
        f"recovering {_secs(split.recovering)} · shut-down {_secs(split.shutdown)}",
    )
    return goodput


def _print_incidents(con: Any, report: Report) -> None:
    """The incidents, their recovery phases and each layer's, then restarts, rollback and
    freshness."""
    shown = report.incidents[:_MAX_INCIDENT_ROWS]
    con.print(_incident_table(shown))
    con.print(_phases_table(report, shown))
    if len(report.incidents) > len(shown):
        con.print(f"[dim]… {len(report.incidents) - len(shown)} more incidents in --json[/]")
    by_layer = ", ".join(f"{k} {v}" for k, v in report.restarts_by_layer.items()) or "none"
    by_cause = ", ".join(f"{k} {v}" for k, v in report.restarts_by_cause.items()) or "none"
    con.print(
        f"[bold]Restarts[/]    by layer: {escape(by_layer)}; by cause: {escape(by_cause)}; "
        f"failed attempts: {report.failed_attempts}"
    )
    con.print(
        f"[bold]Rollback[/]    {_dist(report.rollback_steps, 'steps')}, "
        f"{_dist(report.rollback_s)} of training (median / p95 / max)"
    )
    con.print(
        f"[bold]Freshness[/]   at faults: {_dist(report.freshness_steps, 'steps')}, "
        f"{_dist(report.freshness_s)} since the newest committed checkpoint"
    )


def _phases_table(report: Report, shown: Sequence[Incident]) -> Table:
    """Each shown incident's recovery phases, then each layer's median / p95 / max."""
    from nvtrain.report import PHASES

    phases = make_table(
        title="Recovery phases: each incident, then each layer's median / p95 / max",
        title_justify="left",
        box=None,
        pad_edge=False,
        header_style="bold",
    )
    phases.add_column("", no_wrap=True)
    phases.add_column("", no_wrap=True, style="dim")
    for name in PHASES:
        phases.add_column(_PHASE_LABELS[name], justify="right", no_wrap=True)
    phases.add_column("total", justify="right", no_wrap=True)
    for i in shown:
        cells = [_secs(i.phases.get(name)) for name in PHASES]
        phases.add_row(f"#{i.index} {escape(i.layer)}", "", *cells, _secs(i.seconds))
    for layer in report.layers:
        for n, stat in enumerate(("median", "p95", "max")):
            row = [
                _secs(getattr(s, stat)) if s else _secs(None) for s in (layer.phases.get(p) for p in PHASES)
            ]
            label = f"[bold]{escape(layer.layer)}[/] ({layer.total.count})" if n == 0 else ""
            phases.add_row(label, stat, *row, _secs(getattr(layer.total, stat)), end_section=n == 2)
    return phases


def _print_checkpoints(con: Any, report: Report) -> None:
    """Saves, commits and problems; the time the loop was blocked, the background writes, and
    the saves in flight at soft faults."""
    ckpt = report.checkpoints
    if not (ckpt.saves or ckpt.committed):
        con.print("[bold]Checkpoints[/] none saved")
        return
    total_s = report.time.total
    blocked = ckpt.blocked.total if ckpt.blocked else 0.0
    share = f" ({blocked / total_s:.2%} of the job)" if total_s > 0 else ""
    problems = f"{ckpt.partial} partial, {ckpt.corrupt} corrupt, {ckpt.failed} failed"
    con.print(f"[bold]Checkpoints[/] {ckpt.saves} saves, {ckpt.committed} committed ({problems})")
    waited = f"; waits for the previous write {_dist(ckpt.waited)}" if ckpt.waited else ""
    con.print(f"            blocked {_secs(blocked)} in all{share}, per save {_dist(ckpt.blocked)}{waited}")
    if ckpt.background:
        total = _secs(ckpt.background.total)
        con.print(f"            background writes {_dist(ckpt.background)}, {total} in all")
    if ckpt.finished_at_faults or ckpt.dropped_at_faults:
        con.print(
            f"            in flight at soft faults: {ckpt.finished_at_faults} finished and kept, "
            f"{ckpt.dropped_at_faults} dropped; waited {_dist(ckpt.settle_waited)}"
        )


def _incident_table(incidents: Sequence[Incident]) -> Table:
    table = make_table(title="Incidents", title_justify="left", box=None, pad_edge=False, header_style="bold")
    for name, justify in (
        ("#", "right"),
        ("at", "right"),
        ("cause", "left"),
        ("layer", "left"),
        ("step→resumed", "right"),
        ("from", "left"),
        ("rolled back", "right"),
        ("freshness", "right"),
        ("restarts", "right"),
        ("recovery", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True, min_width=len(name))  # type: ignore[arg-type]
    for i in incidents:
        resumed = "–" if i.restored_step is None else str(i.restored_step)
        rolled = "–" if i.rollback_steps is None else f"{i.rollback_steps} ({_secs(i.lost_s)})"
        fresh = "–" if i.freshness_steps is None else f"{i.freshness_steps} ({_secs(i.freshness_s)})"
        restarts = str(sum(i.restarts.values())) + (
            f" ({i.failed_attempts} failed)" if i.failed_attempts else ""
        )
        table.add_row(
            str(i.index),
            _secs(i.start_t),
            escape(i.cause),
            escape(i.layer),
            f"{'–' if i.last_step is None else i.last_step}→{resumed}",
            escape(i.restore_source or "–")
            + ("" if i.restore_load_s is None else f" {_secs(i.restore_load_s)}"),
            rolled,
            fresh,
            restarts,
            _secs(i.seconds) if i.recovered else "[red]not recovered[/]",
        )
    return table

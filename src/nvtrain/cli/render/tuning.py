"""``nvtrain tune-interval``: the inputs and their origin, the model's intervals, the outcomes,
the advice."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nvtrain.cli.render.console import escape, make_table, out

if TYPE_CHECKING:
    from nvtrain.tuning.advise import Tuned
    from nvtrain.tuning.interval import Outcome

__all__ = ["print_tuning"]

_INPUT_LABELS = {
    "step": "step time",
    "save_block": "blocked per async save",
    "save_write": "background write",
    "restore": "checkpoint load",
    "restart": "restart (without load)",
    "mtbf": "job MTBF",
}


def print_tuning(result: Tuned) -> None:
    """The inputs with their origin, the model's intervals, the table of outcomes, the advice."""
    from nvtrain.tuning.interval import percent
    from nvtrain.tuning.interval import short_duration as d

    report = result.report
    inputs = report.inputs
    head = f"Checkpoint interval ({report.mode} saves)"
    sources = [s for s in (result.events, result.policy) if s]
    out.print(f"[bold]{escape(head)}[/]" + (f" [dim]for {escape(', '.join(sources))}[/]" if sources else ""))
    values = {
        "step": inputs.step_s,
        "save_block": inputs.save_block_s,
        "save_write": inputs.save_write_s,
        "restore": inputs.restore_s,
        "restart": inputs.restart_s,
        "mtbf": inputs.mtbf_s,
    }
    table = make_table(show_edge=False, pad_edge=False, box=None)
    table.add_column("input", style="dim")
    table.add_column("value", justify="right")
    table.add_column("from", style="dim")
    for name, label in _INPUT_LABELS.items():
        value = values[name]
        if value is None:
            continue
        table.add_row(label, d(value) if value else "0", escape(result.origins.get(name, "")))
    out.print(table)
    best = report.best
    floor = f"; async write floor {best.floor_steps} steps" if report.mode == "async" else ""
    out.print(
        f"Blocked per save δ = {d(best.delta_s)}: Young √(2δM) = {d(best.young_s)}, "
        f"Daly = {d(best.daly_s)}{floor}."
    )
    rows = make_table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    for name, justify in (
        ("", "left"),
        ("mode", "left"),
        ("steps", "right"),
        ("every", "right"),
        ("blocked", "right"),
        ("efficiency", "right"),
        ("goodput", "right"),
        ("binds", "left"),
    ):
        rows.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]

    def add(label: str, o: Outcome, binds: str) -> None:
        rows.add_row(
            label,
            o.mode,
            f"{o.interval_steps:,}",
            d(o.interval_s),
            d(o.blocked_s),
            percent(o.efficiency),
            _per_hour(o.goodput_steps_per_h),
            binds,
            style="bold" if o.mode == report.mode else "dim",
        )

    for rec in report.recommended.values():
        add("recommended", rec.outcome, rec.binds)
    for outcome in report.current.values():
        add("current", outcome, "")
    out.print(rows)
    out.print(f"[bold]{escape(report.advice)}[/]")
    for note in result.notes:
        out.print(f"[dim]note: {escape(note)}[/]")
    applied = result.applied
    if applied is not None:
        if applied.changed:
            old = "not set" if applied.old is None else str(applied.old)
            out.print(
                f"[green]applied:[/] {escape(applied.path)}:{applied.line}: "
                f"{escape('[checkpoint]')} interval {old} -> {applied.new}"
            )
        else:
            out.print(f"[green]applied:[/] {escape(applied.path)} already has interval = {applied.new}")


def _per_hour(steps: float) -> str:
    """Steps per hour, short: 881/h, 49.1k/h, 1.69M/h."""
    if steps < 10_000:
        return f"{steps:,.0f}/h"
    if steps < 1_000_000:
        return f"{steps / 1e3:.1f}k/h"
    return f"{steps / 1e6:.2f}M/h"

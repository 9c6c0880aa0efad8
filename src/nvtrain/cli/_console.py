"""Terminal output: the only module that imports rich."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nvtrain.config.findings import Finding
from nvtrain.config.validation import Setting
from nvtrain.errors import NvtrainError, UsageError

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _count(findings: Sequence[Finding], severity: str) -> str:
    n = sum(1 for f in findings if f.severity == severity)
    return f"{n} {severity}{'s' if n != 1 else ''}"


def summary_line(source: str, findings: Sequence[Finding]) -> str:
    parts = [_count(findings, s) for s in ("error", "warning") if any(f.severity == s for f in findings)]
    return f"{source}: " + (", ".join(parts) if parts else "no problems")


def print_findings(source: str, findings: Sequence[Finding]) -> None:
    """Every finding, errors and warnings first in file order, each with its fix."""
    err.print(f"nvtrain: {escape(summary_line(source, findings))}")
    for f in findings:
        place = f.file or source
        if f.line is not None:
            place += f":{f.line}" + (f":{f.column}" if f.column else "")
        value = f" = {f.value}" if f.value is not None else ""
        err.print(
            f"  {escape(place)}: [{_STYLE[f.severity]}]{f.severity}[/] {escape(f.where)}{escape(value)}"
        )
        err.print(f"      {escape(f.rule)}")
        err.print(f"      [dim]fix:[/] {escape(f.fix)}")


def print_settings(title: str, settings: Sequence[Setting]) -> None:
    if not out.is_terminal:  # logs and pipes: whole values, one per line
        out.print(escape(title))
        for s in settings:
            where = f"[{s.table}] " if s.table else ""
            source = "" if s.from_file else "  (default)"
            out.print(escape(f"  {where}{s.key} = {s.value}{source}"), soft_wrap=True)
        return
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("table")
    table.add_column("key")
    table.add_column("value", overflow="fold")
    table.add_column("from")
    for s in settings:
        table.add_row(
            escape(f"[{s.table}]") if s.table else "",
            s.key,
            escape(s.value),
            "file" if s.from_file else "[dim]default[/]",
        )
    out.print(table)


def print_error(exc: NvtrainError) -> None:
    err.print(f"[bold red]nvtrain: error:[/] {escape(str(exc))}")
    if isinstance(exc, UsageError) and exc.fix:
        err.print(f"  [dim]fix:[/] {escape(exc.fix)}")


_QUIET = {"launcher_started"}


def event_reporter() -> Callable[[str, dict[str, Any]], None]:
    """Prints the supervisor's events: styled on a terminal, logfmt lines in pod logs."""
    if err.is_terminal:
        return _styled_event
    return _plain_event


def _plain_event(event: str, fields: dict[str, Any]) -> None:
    if event in _QUIET:
        return
    parts = [f"event={event}"]
    for key, value in fields.items():
        if key == "argv":
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if isinstance(value, str) and (" " in text or '"' in text or not text):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    print(f"nvtrain: {time.strftime('%H:%M:%S')} " + " ".join(parts), file=sys.stderr, flush=True)


_EVENT_STYLE = {
    "worker_failed": "bold red",
    "launcher_exit": "bold",
    "restart_begin": "yellow",
    "relaunch": "yellow",
    "signal": "yellow",
    "dns_wait": "dim",
}


def _styled_event(event: str, fields: dict[str, Any]) -> None:
    if event in _QUIET:
        return
    if event == "launcher_exit":
        style = "bold green" if fields.get("exit_code") == 0 else "bold red"
        err.print(f"[{style}]nvtrain:[/] {escape(str(fields.get('cause', '')))}")
        return
    details = ", ".join(f"{k}={v}" for k, v in fields.items() if k != "argv")
    err.print(f"[{_EVENT_STYLE.get(event, 'cyan')}]nvtrain: {event}[/] {escape(details)}")


# -- tune-interval ----------------------------------------------------------------------------

if TYPE_CHECKING:
    from nvtrain.tuning.advise import Tuned
    from nvtrain.tuning.interval import Outcome

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
    table = Table(show_edge=False, pad_edge=False, box=None)
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
    rows = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
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


# -- init and manifest ------------------------------------------------------------------------


def print_init(directory: str, written: Sequence[str]) -> None:
    """The files ``nvtrain init`` wrote, then the steps from there to a running job."""
    for path in written:
        out.print(f"wrote {escape(path)}", soft_wrap=True)
    policy = escape(written[0]) if written else "policy.toml"
    out.print("next:")
    steps = [
        f"edit {policy}: name, nodes, nproc_per_node, checkpoint dir",
        f"nvtrain validate {policy}",
        f"docker build -t IMAGE {escape(directory)} && docker push IMAGE",
        f"nvtrain manifest {policy} --image IMAGE -o job.yaml",
        "kubectl apply -f job.yaml",
    ]
    for number, step in enumerate(steps, 1):
        out.print(f"  {number}. {step}", soft_wrap=True)


def print_manifest_written(path: str, objects: Sequence[tuple[str, str]]) -> None:
    """Which objects went into the file ``nvtrain manifest -o`` wrote, and how to apply them."""
    out.print(f"wrote {escape(path)}:", soft_wrap=True)
    for kind, name in objects:
        out.print(f"  {escape(kind)} {escape(name)}")
    out.print(f"apply: kubectl apply -f {escape(path)}", soft_wrap=True)


def _per_hour(steps: float) -> str:
    """Steps per hour, short: 881/h, 49.1k/h, 1.69M/h."""
    if steps < 10_000:
        return f"{steps:,.0f}/h"
    if steps < 1_000_000:
        return f"{steps / 1e3:.1f}k/h"
    return f"{steps / 1e6:.2f}M/h"

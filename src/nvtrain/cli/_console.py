"""Terminal output: the only module that imports rich.

rich is imported on first use: `nvtrain validate` writing to a pipe or a log (CI, pod logs)
prints plain lines and never loads it, which keeps the command's start-up short.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nvtrain.config.validation import Setting
from nvtrain.errors import NvtrainError, UsageError
from nvtrain.findings import Finding

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from nvtrain.events import Event, Reporter


class _LazyConsole:
    """A rich ``Console`` made (and rich imported) on first use."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return getattr(self._console, name)


out: Any = _LazyConsole(highlight=False, soft_wrap=False)
err: Any = _LazyConsole(stderr=True, highlight=False, soft_wrap=True)


# C0 controls but tab and newline, DEL and C1 controls (ESC starts the terminal's escape
# sequences, and 0x9b alone is CSI in 8-bit mode); with ``lines=False`` tab and newline too.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROLS_AND_LINES = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def visible(text: str, *, lines: bool = True) -> str:
    """``text`` with its control characters written out as escapes (ESC as ``\\x1b``), so that
    text from outside (an event's fields, a worker's error, a host name, a path, a log line) can
    neither retitle nor clear the terminal, move its cursor or hide what is printed. ``lines``:
    keep tab and newline (the text is ours, laid out in lines); else they are escaped too (a
    field's value stays on its line). Every text from outside goes through here before it is
    printed (``escape`` does it for rich's markup)."""
    pattern = _CONTROLS if lines else _CONTROLS_AND_LINES
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def escape(text: str) -> str:
    """``text`` safe to print through rich: control characters made visible (``visible``),
    rich markup escaped."""
    from rich.markup import escape as rich_escape

    return rich_escape(visible(text))


def _table(*args: Any, **kwargs: Any) -> Table:
    from rich.table import Table

    return Table(*args, **kwargs)


def _console(**options: Any) -> Console:
    from rich.console import Console

    return Console(**options)


_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _count(findings: Sequence[Finding], severity: str) -> str:
    n = sum(1 for f in findings if f.severity == severity)
    return f"{n} {severity}{'s' if n != 1 else ''}"


def summary_line(source: str, findings: Sequence[Finding]) -> str:
    parts = [_count(findings, s) for s in ("error", "warning") if any(f.severity == s for f in findings)]
    return f"{source}: " + (", ".join(parts) if parts else "no errors or warnings")


def print_findings(source: str, findings: Sequence[Finding]) -> None:
    """Every finding, errors and warnings first in file order, each with its fix."""
    plain = not sys.stderr.isatty()
    if plain:
        print(f"nvtrain: {visible(summary_line(source, findings))}", file=sys.stderr)
    else:
        err.print(f"nvtrain: {escape(summary_line(source, findings))}")
    for f in findings:
        place = f.file or source
        if f.line is not None:
            place += f":{f.line}" + (f":{f.column}" if f.column else "")
        value = f" = {f.value}" if f.value is not None else ""
        if plain:
            print(
                f"  {visible(place)}: {f.severity} {visible(f.where)}{visible(value)}\n"
                f"      {visible(f.rule)}\n      fix: {visible(f.fix)}",
                file=sys.stderr,
            )
            continue
        err.print(
            f"  {escape(place)}: [{_STYLE[f.severity]}]{f.severity}[/] {escape(f.where)}{escape(value)}"
        )
        err.print(f"      {escape(f.rule)}")
        err.print(f"      [dim]fix:[/] {escape(f.fix)}")


def print_settings(title: str, settings: Sequence[Setting]) -> None:
    if not sys.stdout.isatty():  # logs and pipes: whole values, one per line
        lines = [visible(title)]
        for s in settings:
            where = f"[{s.table}] " if s.table else ""
            source = "" if s.from_file else "  (default)"
            lines.append(visible(f"  {where}{s.key} = {s.value}{source}"))
        print("\n".join(lines), flush=True)
        return
    table = _table(title=title, title_justify="left", show_edge=False, pad_edge=False)
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


def print_warnings(lines: Sequence[str]) -> None:
    """One ``nvtrain: warning:`` line each, on stderr (stdout may be JSON)."""
    for line in lines:
        err.print(f"[yellow]nvtrain: warning:[/] {escape(line)}", soft_wrap=True)


_QUIET = {"launcher_started"}
_WORKER_FIELDS = (
    "step", "kind", "layer", "iteration", "origin", "seconds", "finished", "problem", "error",
)  # fmt: skip
"""What is shown of a worker's event (after its rank): what happened, not every detail."""


def event_reporter() -> Reporter:
    """Prints the supervisor's events: styled on a terminal, logfmt lines in pod logs."""
    if err.is_terminal:
        return _styled_event
    return _plain_event


def _shown_fields(record: Event) -> dict[str, Any]:
    """The fields of ``record`` to show: a worker's rank and what happened; all of the
    launcher's but its command line (which stays in the events log)."""
    fields = record.fields()
    rank = {} if record.rank is None else {"rank": record.rank}
    if record.source != "worker":  # the launcher's (a worker_failed has the rank it found)
        return {**rank, **{k: v for k, v in fields.items() if k != "argv"}}
    return {**rank, **{k: v for k, v in fields.items() if k in _WORKER_FIELDS}}


def _plain_event(record: Event) -> None:
    if record.name in _QUIET:
        return
    parts = [f"event={record.name}"]
    for key, value in _shown_fields(record).items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        # Quoted as JSON, which escapes every control character (a worker's error, a host name
        # from outside): the value stays on its line and cannot drive the terminal.
        if isinstance(value, str) and (
            " " in text or '"' in text or not text or visible(text, lines=False) != text
        ):
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


def _styled_event(record: Event) -> None:
    from nvtrain.events.records import LauncherExit

    if record.name in _QUIET:
        return
    if isinstance(record, LauncherExit):
        style = "bold green" if record.exit_code == 0 else "bold red"
        err.print(f"[{style}]nvtrain:[/] {escape(record.cause or '')}")
        return
    # A value from outside (a worker's error, a path) stays on its line and cannot drive the terminal.
    details = ", ".join(f"{k}={visible(str(v), lines=False)}" for k, v in _shown_fields(record).items())
    err.print(f"[{_EVENT_STYLE.get(record.name, 'cyan')}]nvtrain: {record.name}[/] {escape(details)}")


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
    table = _table(show_edge=False, pad_edge=False, box=None)
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
    rows = _table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
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


def print_init(directory: str, written: Sequence[str], nvrx: str) -> None:
    """The files ``nvtrain init`` wrote, then the steps from there to a running job; ``nvrx``
    is the NVRx version the written Dockerfile installs."""
    for path in written:
        out.print(f"wrote {escape(path)}", soft_wrap=True)
    policy = escape(written[0]) if written else "policy.toml"
    out.print("next:")
    steps = [
        f"edit {policy}: name, nodes, nproc_per_node, checkpoint dir",
        f"nvtrain validate {policy} --nvrx {escape(nvrx)}",
        f"docker build -t IMAGE {escape(directory)} && docker push IMAGE",
        f"nvtrain manifest {policy} --image IMAGE --nvrx {escape(nvrx)} -o job.yaml",
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


# -- report -----------------------------------------------------------------------------------

if TYPE_CHECKING:
    from pathlib import Path

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
    from nvtrain.report import INFRASTRUCTURE_GOODPUT, PHASES, TRAINING_GOODPUT

    # Logs and pipes get whole rows rather than tables squeezed to 80 columns.
    con = out if out.is_terminal else _console(highlight=False, soft_wrap=False, width=_PIPE_WIDTH)

    def say(*items: Any) -> None:
        con.print(*items)

    split = report.time
    run = f"run {report.run_id}" if report.run_id else "run"
    facts = [f"{report.nodes} node{'s' if report.nodes != 1 else ''}"]
    if report.ranks is not None:
        facts.append(f"{report.ranks} rank{'s' if report.ranks != 1 else ''}")
    facts.append(f"{_secs(split.total)} in all")
    facts.append("no launcher_exit" if report.exit_code is None else f"exit {report.exit_code}")
    if report.final_step is not None:
        facts.append(f"final step {report.final_step}")
    say(f"[bold]{escape(run)}[/]: {escape(', '.join(facts))}  [dim]{escape(report.source)}[/]")

    replays = ""
    if report.lost_steps and report.training_goodput_with_replays is not None:
        replays = (
            f"; {_pct(report.training_goodput_with_replays)} if its {report.lost_steps} rolled-back "
            "steps counted (the reference deployment's way)"
        )
    from rich.table import Table

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
    say("[bold]Goodput[/]")
    say(goodput)

    if report.incidents:
        shown = report.incidents[:_MAX_INCIDENT_ROWS]
        say(_incident_table(shown))
        phases = _table(
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
                    _secs(getattr(s, stat)) if s else _secs(None)
                    for s in (layer.phases.get(p) for p in PHASES)
                ]
                label = f"[bold]{escape(layer.layer)}[/] ({layer.total.count})" if n == 0 else ""
                phases.add_row(label, stat, *row, _secs(getattr(layer.total, stat)), end_section=n == 2)
        say(phases)
        if len(report.incidents) > len(shown):
            say(f"[dim]… {len(report.incidents) - len(shown)} more incidents in --json[/]")
        by_layer = ", ".join(f"{k} {v}" for k, v in report.restarts_by_layer.items()) or "none"
        by_cause = ", ".join(f"{k} {v}" for k, v in report.restarts_by_cause.items()) or "none"
        say(
            f"[bold]Restarts[/]    by layer: {escape(by_layer)}; by cause: {escape(by_cause)}; "
            f"failed attempts: {report.failed_attempts}"
        )
        say(
            f"[bold]Rollback[/]    {_dist(report.rollback_steps, 'steps')}, "
            f"{_dist(report.rollback_s)} of training (median / p95 / max)"
        )
        say(
            f"[bold]Freshness[/]   at faults: {_dist(report.freshness_steps, 'steps')}, "
            f"{_dist(report.freshness_s)} since the newest committed checkpoint"
        )
    else:
        say("[green]No faults and no restarts.[/]")

    ckpt = report.checkpoints
    if ckpt.saves or ckpt.committed:
        blocked = ckpt.blocked.total if ckpt.blocked else 0.0
        share = f" ({blocked / split.total:.2%} of the job)" if split.total > 0 else ""
        problems = f"{ckpt.partial} partial, {ckpt.corrupt} corrupt, {ckpt.failed} failed"
        say(f"[bold]Checkpoints[/] {ckpt.saves} saves, {ckpt.committed} committed ({problems})")
        waited = f"; waits for the previous write {_dist(ckpt.waited)}" if ckpt.waited else ""
        say(f"            blocked {_secs(blocked)} in all{share}, per save {_dist(ckpt.blocked)}{waited}")
        if ckpt.background:
            total = _secs(ckpt.background.total)
            say(f"            background writes {_dist(ckpt.background)}, {total} in all")
        if ckpt.finished_at_faults or ckpt.dropped_at_faults:
            say(
                f"            in flight at soft faults: {ckpt.finished_at_faults} finished and kept, "
                f"{ckpt.dropped_at_faults} dropped; waited {_dist(ckpt.settle_waited)}"
            )
    else:
        say("[bold]Checkpoints[/] none saved")
    if timeline is not None:
        con.print(f"timeline: {escape(str(timeline))}", soft_wrap=True)
    for note in report.notes:
        con.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def _incident_table(incidents: Sequence[Incident]) -> Table:
    table = _table(title="Incidents", title_justify="left", box=None, pad_edge=False, header_style="bold")
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
            escape(i.restore_source or "–"),
            rolled,
            fresh,
            restarts,
            _secs(i.seconds) if i.recovered else "[red]not recovered[/]",
        )
    return table

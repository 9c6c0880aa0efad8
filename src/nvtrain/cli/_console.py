"""Terminal output: the only module that imports rich."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

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
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("table")
    table.add_column("key")
    table.add_column("value")
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

"""Findings (``validate``, a policy that does not load), errors and warnings, on stderr."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from nvtrain.cli.render.console import err, escape, visible
from nvtrain.errors import NvtrainError, UsageError
from nvtrain.findings import Finding

__all__ = ["print_error", "print_findings", "print_warnings", "summary_line"]

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
        sys.stderr.write(f"nvtrain: {visible(summary_line(source, findings))}\n")
    else:
        err.print(f"nvtrain: {escape(summary_line(source, findings))}")
    for f in findings:
        place = f.file or source
        if f.line is not None:
            place += f":{f.line}" + (f":{f.column}" if f.column else "")
        value = f" = {f.value}" if f.value is not None else ""
        if plain:
            sys.stderr.write(
                f"  {visible(place)}: {f.severity} {visible(f.where)}{visible(value)}\n"
                f"      {visible(f.rule)}\n      fix: {visible(f.fix)}\n"
            )
            continue
        err.print(
            f"  {escape(place)}: [{_STYLE[f.severity]}]{f.severity}[/] {escape(f.where)}{escape(value)}"
        )
        err.print(f"      {escape(f.rule)}")
        err.print(f"      [dim]fix:[/] {escape(f.fix)}")


def print_error(exc: NvtrainError) -> None:
    err.print(f"[bold red]nvtrain: error:[/] {escape(str(exc))}")
    if isinstance(exc, UsageError) and exc.fix:
        err.print(f"  [dim]fix:[/] {escape(exc.fix)}")


def print_warnings(lines: Sequence[str]) -> None:
    """One ``nvtrain: warning:`` line each, on stderr (stdout may be JSON)."""
    for line in lines:
        err.print(f"[yellow]nvtrain: warning:[/] {escape(line)}", soft_wrap=True)

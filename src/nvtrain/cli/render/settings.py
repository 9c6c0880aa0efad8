"""The effective policy that ``nvtrain validate`` prints: a table on a terminal, lines in a pipe."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from nvtrain.cli.render.console import escape, make_table, out, visible
from nvtrain.config.validation import Setting

__all__ = ["print_settings"]


def print_settings(title: str, settings: Sequence[Setting]) -> None:
    if not sys.stdout.isatty():  # logs and pipes: whole values, one per line
        lines = [visible(title)]
        for s in settings:
            where = f"[{s.table}] " if s.table else ""
            source = "" if s.from_file else "  (default)"
            lines.append(visible(f"  {where}{s.key} = {s.value}{source}"))
        print("\n".join(lines), flush=True)
        return
    table = make_table(title=escape(title), title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("table")
    table.add_column("key")
    table.add_column("value", overflow="fold")
    table.add_column("from")
    for s in settings:
        table.add_row(
            escape(f"[{s.table}]") if s.table else "",
            escape(s.key),
            escape(s.value),
            "file" if s.from_file else "[dim]default[/]",
        )
    out.print(table)

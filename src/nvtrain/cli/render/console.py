"""The consoles the commands print to, and text from outside made safe to print.

Every console here is made with ``emoji=False``: rich would otherwise turn an emoji code such as
``:x:`` in a user's text (``--volume pvc:x:/etc``) into a picture. Markup stays on for our own
styles, so text from outside goes through ``escape`` (a ``[bold]`` in a value prints as is)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["err", "escape", "make_console", "make_table", "out", "visible"]


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


out: Any = _LazyConsole(highlight=False, soft_wrap=False, emoji=False)
err: Any = _LazyConsole(stderr=True, highlight=False, soft_wrap=True, emoji=False)


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


def make_table(*args: Any, **kwargs: Any) -> Table:
    """A rich ``Table`` (rich imported now)."""
    from rich.table import Table

    return Table(*args, **kwargs)


def make_console(**options: Any) -> Console:
    """A rich ``Console`` of its own (rich imported now), e.g. wider than a pipe's default; no
    emoji codes unless ``options`` asks for them."""
    from rich.console import Console

    return Console(**{"emoji": False, **options})

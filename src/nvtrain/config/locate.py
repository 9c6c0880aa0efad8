"""Where each key of a TOML document is written: line and column, for error messages.

``tomllib`` keeps no positions, so this reads the text once more, line by line. It understands
tables, arrays of tables, dotted and quoted keys, one level of inline tables and multi-line
strings and arrays; a key it cannot place falls back to its table's header.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["Path", "Positions", "key_positions", "lookup"]

Path = tuple[str | int, ...]
Positions = dict[Path, tuple[int, int]]

_BARE = r"[A-Za-z0-9_-]+"
_KEY_PART = rf'(?:{_BARE}|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_DOTTED = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_HEADER = re.compile(rf"^\s*(\[\[?)\s*({_DOTTED})\s*\]\]?")
_ASSIGN = re.compile(rf"^(\s*)({_DOTTED})\s*=\s*")
_INLINE_KEY = re.compile(rf"[{{,]\s*({_DOTTED})\s*=")


def _split(dotted: str) -> tuple[str, ...]:
    parts = re.findall(_KEY_PART, dotted)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def _bracket_balance(text: str) -> int:
    """Open minus closed brackets outside strings and comments."""
    depth, quote, i = 0, "", 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        i += 1
    return depth


def key_positions(text: str) -> Positions:
    """Map every table and key path of ``text`` to its 1-based (line, column)."""
    positions: Positions = {}
    table: Path = ()
    counts: dict[Path, int] = {}
    open_brackets = 0
    in_string = ""
    for number, line in enumerate(text.splitlines(), start=1):
        if in_string:
            if in_string in line:
                in_string = ""
            continue
        if open_brackets > 0:
            open_brackets += _bracket_balance(line)
            continue
        header = _HEADER.match(line)
        if header:
            names = _split(header.group(2))
            if header.group(1) == "[[":
                index = counts.get(names, 0)
                counts[names] = index + 1
                table = (*names, index)
            else:
                table = names
            positions.setdefault(table, (number, header.start(2) + 1))
            continue
        assign = _ASSIGN.match(line)
        if not assign:
            continue
        path = (*table, *_split(assign.group(2)))
        positions.setdefault(path, (number, len(assign.group(1)) + 1))
        rest = line[assign.end() :]
        for quote in ('"""', "'''"):
            if rest.startswith(quote) and rest.count(quote) == 1:
                in_string = quote
        if rest.startswith("{"):
            for inner in _INLINE_KEY.finditer(rest):
                sub = (*path, *_split(inner.group(1)))
                positions.setdefault(sub, (number, assign.end() + inner.start(1) + 1))
        open_brackets = _bracket_balance(rest)
    return positions


def lookup(positions: Positions, path: Sequence[str | int]) -> tuple[int, int] | None:
    """Position of ``path``, or of the nearest enclosing table that is written in the file."""
    for end in range(len(path), 0, -1):
        found = positions.get(tuple(path[:end]))
        if found:
            return found
    return None

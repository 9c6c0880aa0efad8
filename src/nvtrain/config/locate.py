"""Where each key of a TOML document is written: line and column, for error messages.

``tomllib`` keeps no positions, so this scans the (already valid) text once more with a small
tokenizer that knows TOML's strings (basic, literal, multi-line, escapes), comments, arrays,
inline tables, dotted and quoted keys, tables and arrays of tables. Only ``\\n`` ends a line, as
in TOML. A key it cannot place falls back to its table's header.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["Path", "Positions", "key_positions", "lookup"]

Path = tuple[str | int, ...]
Positions = dict[Path, tuple[int, int]]

_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.starts = [0] + [k + 1 for k, ch in enumerate(text) if ch == "\n"]
        self.positions: Positions = {}

    # -- helpers --------------------------------------------------------------------------
    def where(self, index: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.starts, index)
        return line, index - self.starts[line - 1] + 1

    def peek(self, ahead: int = 0) -> str:
        j = self.i + ahead
        return self.text[j] if j < len(self.text) else ""

    def skip_blank(self, newlines: bool) -> None:
        """Skip spaces and tabs (and newlines and comments when ``newlines``)."""
        while self.i < len(self.text):
            ch = self.text[self.i]
            if ch in " \t\r" or (newlines and ch == "\n"):
                self.i += 1
            elif ch == "#":
                end = self.text.find("\n", self.i)
                self.i = len(self.text) if end < 0 else (end + 1 if newlines else end)
            else:
                return

    def skip_line(self) -> None:
        end = self.text.find("\n", self.i)
        self.i = len(self.text) if end < 0 else end + 1

    def record(self, path: Path, index: int) -> None:
        self.positions.setdefault(path, self.where(index))

    # -- keys -------------------------------------------------------------------------------
    def key(self) -> list[tuple[str, int]]:
        """A dotted key: its parts with the index where each starts."""
        parts: list[tuple[str, int]] = []
        while True:
            self.skip_blank(newlines=False)
            start = self.i
            ch = self.peek()
            if ch in "\"'":
                parts.append((self.string_value(), start))
            else:
                while self.peek() in _BARE and self.peek():
                    self.i += 1
                if self.i == start:
                    raise ValueError("expected a key")
                parts.append((self.text[start : self.i], start))
            self.skip_blank(newlines=False)
            if self.peek() != ".":
                return parts
            self.i += 1

    # -- values -----------------------------------------------------------------------------
    def string_value(self) -> str:
        """Consume a string of any kind; returns its (unescaped enough for keys) content."""
        text = self.text
        for quote in ('"""', "'''"):
            if text.startswith(quote, self.i):
                j = self.i + 3
                while True:
                    end = text.find(quote, j)
                    if end < 0:
                        raise ValueError("unterminated string")
                    if quote == '"""':
                        slashes = 0
                        k = end - 1
                        while k >= j and text[k] == "\\":
                            slashes += 1
                            k -= 1
                        if slashes % 2:
                            j = end + 1
                            continue
                    while text.startswith(quote[0], end + 3):  # up to two quotes inside the end
                        end += 1
                    content = text[self.i + 3 : end]
                    self.i = end + 3
                    return content
        quote = text[self.i]
        j = self.i + 1
        while j < len(text):
            if quote == '"' and text[j] == "\\":
                j += 2
                continue
            if text[j] == quote:
                content = text[self.i + 1 : j]
                self.i = j + 1
                return content
            j += 1
        raise ValueError("unterminated string")

    def value(self, path: Path) -> None:
        ch = self.peek()
        if ch in "\"'":
            self.string_value()
        elif ch == "[":
            self.i += 1
            while True:
                self.skip_blank(newlines=True)
                if self.peek() == "]":
                    self.i += 1
                    return
                self.value(path)
                self.skip_blank(newlines=True)
                if self.peek() == ",":
                    self.i += 1
        elif ch == "{":
            self.i += 1
            while True:
                self.skip_blank(newlines=False)
                if self.peek() == "}":
                    self.i += 1
                    return
                parts = self.key()
                sub = path + tuple(name for name, _ in parts)
                self.record(sub, parts[0][1])
                self.skip_blank(newlines=False)
                self.i += 1  # '='
                self.skip_blank(newlines=False)
                self.value(sub)
                self.skip_blank(newlines=False)
                if self.peek() == ",":
                    self.i += 1
        else:
            while self.peek() and self.peek() not in ",]}#\n":
                self.i += 1

    # -- statements -------------------------------------------------------------------------
    def document(self) -> Positions:
        table: Path = ()
        counts: dict[Path, int] = {}
        while True:
            self.skip_blank(newlines=True)
            if self.i >= len(self.text):
                return self.positions
            if self.peek() == "[":
                double = self.peek(1) == "["
                self.i += 2 if double else 1
                parts = self.key()
                names = tuple(name for name, _ in parts)
                if double:
                    index = counts.get(names, 0)
                    counts[names] = index + 1
                    table = (*names, index)
                else:
                    table = names
                self.record(table, parts[0][1])
                self.skip_line()
                continue
            parts = self.key()
            path = table + tuple(name for name, _ in parts)
            self.record(path, parts[0][1])
            self.skip_blank(newlines=False)
            self.i += 1  # '='
            self.skip_blank(newlines=False)
            self.value(path)


def key_positions(text: str) -> Positions:
    """Map every table and key path of ``text`` to its 1-based (line, column).

    Meant for text that ``tomllib`` accepted; for anything else it returns what it found
    before the first surprise.
    """
    scanner = _Scanner(text)
    try:
        return scanner.document()
    except (ValueError, IndexError):
        return scanner.positions


def lookup(positions: Positions, path: Sequence[str | int]) -> tuple[int, int] | None:
    """Position of ``path``, or of the nearest enclosing table that is written in the file."""
    for end in range(len(path), 0, -1):
        found = positions.get(tuple(path[:end]))
        if found:
            return found
    return None

"""``tune-interval --apply``: write a new ``[checkpoint] interval`` into a policy file.

Only that value changes: its digits are replaced on their line, or, when the key is not written,
one ``interval = N`` line is added under ``[checkpoint]`` (the table is appended when the file
has none). Comments, order, spacing and line endings stay as they are. The result is parsed and
compared with the original (every other value must be equal) and validated as a policy before
it atomically replaces the file.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from nvtrain.atomic import write_atomically
from nvtrain.config.load import read_source
from nvtrain.config.locate import key_positions
from nvtrain.config.validation import validate_source
from nvtrain.errors import ConfigError, UsageError
from nvtrain.tuning.apply_errors import check_writable, write_error

__all__ = ["Applied", "apply_interval", "rewrite_interval"]

_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_KEY = re.compile(rf"{_PART}(?:\s*\.\s*{_PART})*")
_ASSIGN = re.compile(rf"(?P<key>{_KEY.pattern})\s*=\s*")
_INTEGER = re.compile(r"[+-]?(?:0x[0-9A-Fa-f_]+|0o[0-7_]+|0b[01_]+|[0-9_]+)(?=\s*(?:[,}#\r\n]|$))")
_NOT_NEWLINES = str.maketrans(dict.fromkeys("\v\f\x1c\x1d\x1e\x85\u2028\u2029", " "))
_HEADER = re.compile(rf"\s*\[\s*(?P<name>{_KEY.pattern})\s*\]")


@dataclasses.dataclass(frozen=True, slots=True)
class Applied:
    """What ``apply_interval`` did."""

    path: str
    old: int | None
    """The interval written before; None when the key was not written (the default applied)."""
    new: int
    line: int
    """1-based line of the interval in the new file."""
    changed: bool
    """False when the file already held this interval (then it is not rewritten)."""


def rewrite_interval(text: str, interval: int) -> tuple[str, int]:
    """``text`` with ``[checkpoint] interval = interval``, and the line it is on.

    Raises ``ValueError`` when ``text`` is not TOML or the key cannot be placed safely.
    """
    if interval < 1:
        raise ValueError(f"the interval must be at least 1 step (got {interval})")
    data = tomllib.loads(text)
    checkpoint = data.get("checkpoint", {})
    if not isinstance(checkpoint, dict):
        raise ValueError("`checkpoint` is not a table")
    newline = "\r\n" if "\r\n" in text else "\n"
    # TOML lines end at "\n" only; str.splitlines() would also break at characters that may
    # stand in comments (U+2028, U+0085, ...), so they are blanked out before locating keys.
    lines = text.split("\n")
    positions = key_positions(text.translate(_NOT_NEWLINES))
    found = positions.get(("checkpoint", "interval"))
    if found is not None and "interval" in checkpoint:
        number, column = found
        line = lines[number - 1]
        assign = _ASSIGN.match(line, column - 1)
        value = _INTEGER.match(line, assign.end()) if assign else None
        if value is None:
            raise ValueError(f"line {number} does not hold the interval as a plain integer")
        if checkpoint["interval"] == interval:
            return text, number  # written as 1_000 or 0x3e8 perhaps: leave it as it is
        lines[number - 1] = line[: value.start()] + str(interval) + line[value.end() :]
        new, at = "\n".join(lines), number
    elif "checkpoint" in data:
        new, at = _insert(lines, positions, interval)
    else:
        body = text if not text or text.endswith("\n") else text + newline
        gap = newline if body.strip() else ""
        new = f"{body}{gap}[checkpoint]{newline}interval = {interval}{newline}"
        at = new.count("\n")
    expected = copy.deepcopy(data)
    expected.setdefault("checkpoint", {})["interval"] = interval
    if tomllib.loads(new) != expected:
        raise ValueError("the rewritten file would change more than the interval")
    return new, at


def _insert(lines: list[str], positions: dict[Any, tuple[int, int]], interval: int) -> tuple[str, int]:
    """Add the key to an existing ``checkpoint`` table written without it (``lines`` split at
    "\\n"; a new line ends like the line it follows)."""
    table = positions.get(("checkpoint",))
    if table is not None:
        number, column = table
        line = lines[number - 1]
        cr = "\r" if line.endswith("\r") else ""
        header = _HEADER.match(line)
        if header is not None and _unquote(header.group("name")) == ("checkpoint",):
            lines.insert(number, f"interval = {interval}{cr}")
            return "\n".join(lines), number + 1
        brace = line.find("{", column - 1)
        if brace >= 0:  # checkpoint = { ... } (an inline table)
            rest = line[brace + 1 :]
            filler = f" interval = {interval}" + (" " if rest.lstrip().startswith("}") else ",")
            lines[number - 1] = line[: brace + 1] + filler + rest
            return "\n".join(lines), number
    dotted = [pos for path, pos in positions.items() if len(path) == 2 and path[0] == "checkpoint"]
    if dotted:  # checkpoint.dir = "..." written as dotted keys
        number, column = min(dotted)
        line = lines[number - 1]
        cr = "\r" if line.endswith("\r") else ""
        lines.insert(number, f"{line[: column - 1]}checkpoint.interval = {interval}{cr}")
        return "\n".join(lines), number + 1
    raise ValueError("cannot tell where the [checkpoint] table is written")


def _unquote(dotted: str) -> tuple[str, ...]:
    parts = re.findall(_PART, dotted)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def apply_interval(path: Path, interval: int) -> Applied:
    """Set ``[checkpoint] interval`` in the policy file at ``path``; nothing else changes.

    The file must be a valid policy before and after (``ConfigError`` otherwise); it is replaced
    atomically (a symbolic link keeps pointing at the rewritten file).
    """
    target = path.resolve()
    raw, problem = read_source(target)
    if raw is None:
        assert problem is not None
        raise UsageError(
            f"--apply: {path} cannot be read: {problem.rule}",
            "give the policy file (TOML) whose interval should change",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--apply: {path} is not UTF-8 text", "save the policy as UTF-8") from None
    before = validate_source(text, str(path))
    if not before.ok or before.policy is None:
        raise ConfigError(before.source, before.findings)
    old = before.data.get("checkpoint", {}).get("interval")
    try:
        new, line = rewrite_interval(text, interval)
    except ValueError as exc:
        raise UsageError(
            f"--apply: cannot rewrite {path}: {exc}",
            f"set `interval = {interval}` under [checkpoint] by hand",
        ) from None
    if new == text:
        return Applied(str(path), old, interval, line, changed=False)
    after = validate_source(new, str(path))
    if not after.ok:
        raise ConfigError(after.source, after.findings)
    check_writable(path, target)
    _replace(path, target, new.encode("utf-8"))
    return Applied(str(path), old, interval, line, changed=True)


def _replace(path: Path, target: Path, data: bytes) -> None:
    """Write ``data`` to a new file next to ``target`` and rename it over ``target``
    (``write_atomically``), then sync the folder."""
    try:
        write_atomically(target, data)
    except OSError as exc:
        raise write_error(path, target, exc) from None
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)

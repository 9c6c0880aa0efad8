"""Read a TOML file into a validated model, turning every problem into a ``Finding``.

Nothing here raises on bad input: bytes that are not UTF-8, TOML syntax errors, wrong types,
unknown keys and out-of-range values all come back as findings with file, line, key and fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import os
import re
import stat
import tomllib
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from nvtrain.config.duration import format_duration, is_duration_field, parse_duration
from nvtrain.config.locate import Positions, key_positions, lookup
from nvtrain.config.schema import table_model
from nvtrain.findings import Finding, table_label, toml_value

__all__ = [
    "MAX_FILE_BYTES",
    "UTF8_BOM",
    "Parsed",
    "attach_positions",
    "parse_model",
    "read_source",
    "too_complex",
    "validate_data",
]

M = TypeVar("M", bound=BaseModel)

# Examples offered when a required key is missing.
_EXAMPLES = {"name": '"my-job"', "step": "100", "rank": "1", "kind": '"exception"', "median": '"1s"'}


@dataclasses.dataclass(frozen=True)
class Parsed(typing.Generic[M]):
    """The outcome of reading one file: the model (None on errors), findings, key positions."""

    source: str
    model: M | None
    findings: list[Finding]
    positions: Positions
    data: dict[str, Any]


UTF8_BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte order mark, dropped from the start of the files read (``read_source``)."""

MAX_FILE_BYTES = 4 * 1024 * 1024
"""Largest policy, timings or manifest file read (4 MiB; a policy is a few KiB, and a
Kubernetes ConfigMap holds at most 1 MiB). Bigger files are refused before they are read."""


def read_source(
    path: Path, missing_fix: str = "check the path, or run `nvtrain init` to write a starter policy"
) -> tuple[bytes | None, Finding | None]:
    """The file's bytes, or a finding that says why it cannot be read.

    Only regular files are read (a FIFO or a device such as ``/dev/zero`` would block or never
    end), and at most ``MAX_FILE_BYTES`` of them. A UTF-8 byte order mark at the start (which
    some Windows editors write) is dropped: TOML and JSON do not allow one, and editors do not
    show it, so the lines and columns of findings stay those the editor shows."""
    try:
        return _read_regular(path).removeprefix(UTF8_BOM), None
    except _NotRegular as exc:
        rule = f"is not a regular file (it is {exc.kind})"
        fix = "give the path of the policy file itself (a FIFO, device or socket cannot be read as one)"
        return None, Finding("error", "unreadable", "", None, rule, fix, file=str(path))
    except _TooLarge as exc:
        rule = f"is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB ({exc.size} bytes)"
        fix = "give the right file: a policy is a few KiB"
        return None, Finding("error", "too-large", "", None, rule, fix, file=str(path))
    except FileNotFoundError:
        rule, fix = "file not found", missing_fix
    except IsADirectoryError:
        rule, fix = "is a directory, not a file", "give the path of the .toml file inside it"
    except PermissionError:
        rule, fix = "permission denied", "make the file readable by this user"
    except OSError as exc:
        rule, fix = f"cannot be read ({exc.strerror or exc})", "check the path and the storage"
    return None, Finding("error", "unreadable", "", None, rule, fix, file=str(path))


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class _NotRegular(Exception):
    def __init__(self, mode: int) -> None:
        super().__init__(mode)
        self.kind = next((name for test, name in _KINDS if test(mode)), "neither a file nor a directory")


class _TooLarge(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def _read_regular(path: Path) -> bytes:
    """The bytes of the regular file at ``path``, at most ``MAX_FILE_BYTES`` of them.

    Checked before opening (opening a FIFO waits for a writer) and again on the open file (the
    path may have changed in between); opened without blocking, read with a cap (files in
    /proc report size 0)."""
    before = os.stat(path)
    if stat.S_ISDIR(before.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(before.st_mode):
        raise _NotRegular(before.st_mode)
    if before.st_size > MAX_FILE_BYTES:
        raise _TooLarge(before.st_size)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        opened = os.fstat(file.fileno())
        if not stat.S_ISREG(opened.st_mode):
            raise _NotRegular(opened.st_mode)
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise _TooLarge(max(len(data), opened.st_size))
    return data


def parse_model(raw: bytes | str, source: str, model: type[M]) -> Parsed[M]:
    """Decode, parse and validate ``raw`` as ``model``; never raises for bad input."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            finding = Finding(
                "error",
                "not-utf8",
                "",
                None,
                f"is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})",
                "save the file as UTF-8 (TOML files must be UTF-8)",
                file=source,
                line=line,
            )
            return Parsed(source, None, [finding], {}, {})
    else:
        text = raw
    text = text.removeprefix("\ufeff")  # a byte order mark (see ``read_source``)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return Parsed(source, None, [_syntax_finding(exc, source)], {}, {})
    except ValueError as exc:  # e.g. an integer of more than 4300 digits (int() refuses it)
        return Parsed(source, None, [_value_finding(exc, source)], {}, {})
    except (RecursionError, MemoryError) as exc:
        return Parsed(source, None, [too_complex(exc, source)], {}, {})
    try:
        return validate_data(data, source, model, key_positions(text))
    except (RecursionError, MemoryError) as exc:  # nested deeper than TOML parses, but not by far
        return Parsed(source, None, [too_complex(exc, source)], {}, {})


def too_complex(exc: BaseException, source: str) -> Finding:
    """The finding for a document too deeply nested (``RecursionError``) or too big
    (``MemoryError``) to be read."""
    rule = (
        "cannot be read: arrays or tables are nested too deeply"
        if isinstance(exc, RecursionError)
        else "cannot be read: it needs more memory than there is"
    )
    return Finding(
        "error",
        "too-nested" if isinstance(exc, RecursionError) else "too-large",
        "",
        None,
        rule,
        "give the right file: no key of a policy or timings file holds values nested this deep",
        file=source,
    )


def _value_finding(exc: ValueError, source: str) -> Finding:
    return Finding(
        "error",
        "toml-syntax",
        "",
        None,
        f"TOML syntax error: a value cannot be read ({str(exc).split(';')[0]})",
        "write numbers with at most 19 digits (TOML integers are 64-bit)",
        file=source,
    )


def validate_data(data: dict[str, Any], source: str, model: type[M], positions: Positions) -> Parsed[M]:
    """Validate already-parsed ``data`` as ``model``; never raises for bad input."""
    try:
        return Parsed(source, model.model_validate(data), [], positions, data)
    except ValidationError as exc:
        findings = _merge(_finding_for(err, data, model) for err in exc.errors())
        return Parsed(source, None, attach_positions(findings, source, positions), positions, data)


def attach_positions(
    findings: Iterable[Finding], source: str, positions: Positions, data: dict[str, Any] | None = None
) -> list[Finding]:
    """Fill in file, line and column, and sort by position. With the document's ``data``, a
    duration a check shows in its own words (``"1m30s"``) is shown as the file writes it
    (``"90s"``) when the two are the same length of time."""
    placed = []
    for f in findings:
        path: list[str | int] = [int(p) if p.isdigit() else p for p in f.table.split(".") if p]
        if f.key:
            path.append(f.key)
        pos = lookup(positions, path)
        value = f.value if data is None or f.value is None else _as_written(f.value, data, path)
        placed.append(
            dataclasses.replace(
                f, file=source, line=pos[0] if pos else None, column=pos[1] if pos else None, value=value
            )
        )
    return sorted(placed, key=Finding.sort_key)


def _as_written(shown: str, data: dict[str, Any], path: Sequence[str | int]) -> str:
    """``shown`` (a finding's value as TOML), or the file's own text for the same duration."""
    node: Any = data
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return shown
    if isinstance(node, bool) or not isinstance(node, str | int | float) or toml_value(node) == shown:
        return shown
    try:
        same = toml_value(format_duration(parse_duration(node))) == shown
    except (ValueError, TypeError):
        return shown
    return toml_value(node) if same else shown


def _syntax_finding(exc: tomllib.TOMLDecodeError, source: str) -> Finding:
    message = str(exc)
    where = re.search(r"\(at line (\d+), column (\d+)\)", message)
    rule = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", message)
    return Finding(
        "error",
        "toml-syntax",
        "",
        None,
        f"TOML syntax error: {rule[:1].lower()}{rule[1:]}",
        "fix the syntax at the position shown (strings need quotes; tables are [name])",
        file=source,
        line=int(where.group(1)) if where else None,
        column=int(where.group(2)) if where else None,
    )


def _toml_path(loc: Sequence[str | int], data: Any) -> tuple[str | int, ...]:
    """The part of a pydantic error location that is a path in the TOML document.

    Union branches and other validator tags in ``loc`` are dropped; a missing or unknown key
    keeps its own name as the last element.
    """
    path: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict):
            path.append(part)
            if part not in node:
                break
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            if not isinstance(node[part], dict):  # an element of a plain array: the key is it
                break
            path.append(part)
            node = node[part]
        else:
            break
    return tuple(path)


def _model_at(model: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class that validates the table at ``path``, if any."""
    current: Any = model
    for part in path:
        if isinstance(part, int):
            continue
        fields = current.model_fields if _is_model(current) else {}
        info = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        if info is None:
            return None
        current = table_model(info.annotation)
        if current is None:
            return None
    return current if _is_model(current) else None


def _is_model(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseModel)


def _key_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _default_example(model: type[BaseModel] | None, key: str) -> str | None:
    if model is None:
        return None
    info = next((f for n, f in model.model_fields.items() if key in (n, f.alias)), None)
    if info is None:
        return _EXAMPLES.get(key)
    if info.default_factory is not None or info.is_required():
        return _EXAMPLES.get(key)
    default = info.default
    if default is None:
        return None
    if is_duration_field(info.metadata):
        return toml_value(format_duration(default))
    return toml_value(default)


def _example_label(model: type[BaseModel] | None, key: str | None) -> str:
    info = model.model_fields.get(key) if model and key else None
    return "default: " if info is not None and not info.is_required() else "e.g. "


_TYPE_RULES = {
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be an array",
    "model_type": "must be a table",
    "dict_type": "must be a table",
    "model_attributes_type": "must be a table",
}


def _finding_for(err: ErrorDetails, data: Any, model: type[BaseModel]) -> Finding:
    path = _toml_path(err["loc"], data)
    key = path[-1] if path and isinstance(path[-1], str) else None
    table_path = path[:-1] if key is not None else path
    table = ".".join(str(p) for p in table_path)
    parent = _model_at(model, table_path)
    kind = err["type"]
    ctx = err.get("ctx", {})
    value: str | None = None if kind == "missing" else toml_value(err.get("input"))
    example = _default_example(parent, key) if key else None
    shown_key = key or table
    if kind == "missing":
        rule = "is required"
        fix = f"add `{key} = {example or '...'}` to {table_label(table)}" if table else f"add [{key}]"
        if key and parent is None:
            fix = f"add `{key} = ...`"
    elif kind == "extra_forbidden":
        valid = _key_names(parent) if parent else []
        close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
        rule = "unknown key"
        fix = (f'did you mean "{close[0]}"? ' if close else "") + (
            "valid keys: " + ", ".join(sorted(valid)) if valid else "remove it"
        )
    elif kind == "literal_error":
        expected = str(ctx.get("expected", ""))
        rule = f"must be one of {expected}"
        fix = f"use one of {expected}"
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[
            kind
        ]
        bound = next(iter(ctx.values()), "")
        rule = f"must be {op} {bound}"
        fix = f"use a value {op} {bound}" + (f" ({_example_label(parent, key)}{example})" if example else "")
    elif kind == "string_too_short":
        rule = "must not be empty"
        fix = f"set it, e.g. `{shown_key} = {example}`" if example else "give a non-empty string"
    elif kind in _TYPE_RULES:
        rule = _TYPE_RULES[kind]
        fix = f"write e.g. `{shown_key} = {example}`" if example else "change the value's type"
    elif kind == "value_error":
        message = str(err["msg"]).removeprefix("Value error, ")
        rule, _, fix = message.partition("; ")
        fix = fix or "change the value"
    else:
        rule = str(err["msg"]).rstrip(".").lower()
        fix = f"write e.g. `{shown_key} = {example}`" if example else "change the value"
    loc = list(err["loc"])
    element = loc[len(path)] if len(loc) > len(path) else None
    if isinstance(element, int) and kind != "missing":
        rule = f"element {element + 1} {rule}"  # an element of a plain array
    return Finding("error", kind, table, key, rule, fix, value)


def _merge(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per key: union branches that all failed become one rule."""
    merged: dict[tuple[str, str | None], Finding] = {}
    for f in findings:
        seen = merged.get((f.table, f.key))
        if seen is None:
            merged[(f.table, f.key)] = f
        elif f.rule not in seen.rule:
            merged[(f.table, f.key)] = dataclasses.replace(
                seen,
                rule=f"{seen.rule}, or {f.rule.removeprefix('must be ')}",
                fix=f"{seen.fix}; or {f.fix}" if f.fix != seen.fix else seen.fix,
            )
    return list(merged.values())

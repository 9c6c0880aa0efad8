"""Policies for the runs: TOML written from tables, fault tables, argument lists."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def toml_list(values: Iterable[object]) -> str:
    """``["a", "b"]``: a TOML array of strings (JSON's quoting is TOML's basic string)."""
    return "[" + ", ".join(json.dumps(str(v)) for v in values) + "]"


def toml_text(tables: Mapping[str, Any], faults: Iterable[Mapping[str, Any]] = ()) -> str:
    """One ``[name]`` section per table (nested tables as dotted sections; a list of tables,
    such as a loaded policy's ``faults``, as ``[[name]]`` entries), then one ``[[faults]]``
    entry per fault; values written by nvtrain's own TOML writer."""
    from nvtrain.findings import toml_value

    lines: list[str] = []

    def section(header: str, name: str, keys: Mapping[str, Any]) -> None:
        lines.append(header)
        nested = {k: v for k, v in keys.items() if isinstance(v, Mapping)}
        lines.extend(f"{k} = {toml_value(v, limit=1 << 20)}" for k, v in keys.items() if k not in nested)
        lines.append("")
        for key, value in nested.items():
            section(f"[{name}.{key}]", f"{name}.{key}", value)

    extra = [dict(fault) for fault in faults]
    for name, keys in [*tables.items(), *([("faults", extra)] if extra else [])]:
        if isinstance(keys, list):
            for entry in keys:
                section(f"[[{name}]]", name, entry)
        else:
            section(f"[{name}]", name, keys)
    return "\n".join(lines)


def write_policy(
    path: Path, tables: Mapping[str, Mapping[str, Any]], faults: Iterable[Mapping[str, Any]] = ()
) -> Path:
    """``toml_text(tables, faults)`` into ``path``; returns ``path``."""
    path.write_text(toml_text(tables, faults), encoding="utf-8")
    return path


def load_tables(path: Path) -> dict[str, Any]:
    """A policy file's tables, to change and write again."""
    return dict(tomllib.loads(path.read_text(encoding="utf-8")))


def fault_tables(faults: Iterable[tuple[int, int, str]]) -> str:
    """``[[faults]]`` entries for (step, rank, kind) triples, one blank line between them."""
    return "\n".join(
        f'[[faults]]\nstep = {step}\nrank = {rank}\nkind = "{kind}"\n' for step, rank, kind in faults
    )

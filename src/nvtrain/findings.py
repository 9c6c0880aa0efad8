"""A finding of ``validate`` or the manifest checks: one problem (or remark) about one key of
one file, with the value, rule and fix."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

__all__ = ["Finding", "Severity", "has_errors", "table_label", "toml_value"]

Severity = Literal["error", "warning", "info"]
_ORDER = {"error": 0, "warning": 1, "info": 2}


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    """One problem or remark.

    ``table`` is the dotted TOML table (``"restart.in_job"``; ``"faults.1"`` for the second
    ``[[faults]]`` entry; ``""`` for the top level), ``key`` the key inside it (None when the
    finding is about the whole table or file), ``value`` the value found written as TOML (None
    when the key is missing), ``rule`` what is wrong and ``fix`` what to do about it.
    """

    severity: Severity
    code: str
    table: str
    key: str | None
    rule: str
    fix: str
    value: str | None = None
    file: str = ""
    line: int | None = None
    column: int | None = None

    @property
    def where(self) -> str:
        """``[restart.in_job] max_restarts``, ``[[faults]] #2 rank`` or ``(top level) key``."""
        table = table_label(self.table)
        return f"{table} {self.key}" if self.key else table

    def sort_key(self) -> tuple[int, int, str]:
        return (self.line if self.line is not None else 1 << 30, _ORDER[self.severity], self.where)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["where"] = self.where
        return data


def table_label(table: str) -> str:
    """How a dotted table path is written for people: ``[restart.in_job]``, ``[[faults]] #2``."""
    head, _, index = table.rpartition(".")
    if head and index.isdigit():
        return f"[[{head}]] #{int(index) + 1}"
    return f"[{table}]" if table else "(top level)"


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def toml_value(value: object, limit: int = 80) -> str:
    """``value`` written as it would appear in a TOML file, shortened to ``limit`` characters.

    Arrays and tables are written only as far as the limit: a huge or deeply nested value costs
    no more than a short one."""
    text = _written(value, limit + 1)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _written(value: object, budget: int) -> str:
    """A prefix of ``value`` written as TOML: all of it, or at least ``budget`` characters."""
    budget = max(budget, 1)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        if len(value) > budget:
            return json.dumps(value[:budget], ensure_ascii=False)[:-1]
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | dict):
        items = list(value.items()) if isinstance(value, dict) else value
        text = "{" if isinstance(value, dict) else "["
        for i, item in enumerate(items):
            if len(text) >= budget:
                return text
            text += ", " if i else ""
            if isinstance(value, dict):
                key, item = item
                text += f"{key} = "
            text += _written(item, budget - len(text))
        return text + ("}" if isinstance(value, dict) else "]")
    return str(value)

"""Validate a policy file from end to end: read, parse, type-check, cross-check.

``validate_file`` never raises for bad input; ``load_policy`` is the strict entry point for
commands that need a usable policy, and raises ``ConfigError`` with every finding.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from nvtrain.config.checks import check
from nvtrain.config.demo import DEMO_POLICY_SOURCE, demo_policy_text
from nvtrain.config.duration import format_duration, is_duration_field
from nvtrain.config.load import attach_positions, parse_model, read_source
from nvtrain.config.schema import Policy
from nvtrain.errors import ConfigError
from nvtrain.findings import Finding, toml_value
from nvtrain.nvrx import NvrxVersion, installed_nvrx

if TYPE_CHECKING:
    from collections.abc import Sequence

    from nvtrain.config.timings import Timings

__all__ = [
    "Setting",
    "Validation",
    "effective_settings",
    "load_policy",
    "validate_file",
    "validate_source",
]

NvrxChoice = NvrxVersion | Literal["installed"] | None


@dataclasses.dataclass(frozen=True)
class Validation:
    """The outcome of validating one policy (and, optionally, a timings file)."""

    source: str
    policy: Policy | None
    findings: list[Finding]
    nvrx: NvrxVersion | None
    data: dict[str, Any]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return self.policy is not None and not self.errors


def validate_file(
    path: Path | None,
    *,
    nvrx: NvrxChoice = "installed",
    timings: Timings | None = None,
    timings_findings: Sequence[Finding] = (),
) -> Validation:
    """Validate the policy at ``path`` (the built-in demo policy when None), against measured
    ``timings`` if given (``timings_findings``: the problems of reading them, reported too)."""
    if path is None:
        return validate_source(
            demo_policy_text(),
            DEMO_POLICY_SOURCE,
            nvrx=nvrx,
            timings=timings,
            timings_findings=timings_findings,
        )
    raw, problem = read_source(path)
    if raw is None:
        assert problem is not None
        return Validation(str(path), None, [problem], None, {})
    return validate_source(raw, str(path), nvrx=nvrx, timings=timings, timings_findings=timings_findings)


def validate_source(
    raw: bytes | str,
    source: str,
    *,
    nvrx: NvrxChoice = "installed",
    timings: Timings | None = None,
    timings_findings: Sequence[Finding] = (),
) -> Validation:
    """Validate policy text ``raw`` read from ``source`` (a name used in messages); see
    ``validate_file`` for ``timings``."""
    parsed = parse_model(raw, source, Policy)
    findings = list(parsed.findings)
    version: NvrxVersion | None
    if nvrx == "installed":
        version = installed_nvrx()
        if version is None:
            findings.append(
                Finding(
                    "info",
                    "nvrx-missing",
                    "",
                    None,
                    "NVRx is not installed here, so version-specific checks were skipped",
                    "pass --nvrx with the version in your training image, e.g. --nvrx 0.7.0",
                    file=source,
                )
            )
    else:
        version = nvrx
    findings.extend(timings_findings)
    model = parsed.model if parsed.model is not None else _salvage(parsed.data, parsed.findings)
    if model is not None:
        bad = {(f.table, f.key) for f in parsed.findings}
        found = [f for f in check(model, nvrx=version, timings=timings) if (f.table, f.key) not in bad]
        if parsed.model is None:
            # The salvaged policy has defaults where keys failed their type checks: drop the
            # cross-field findings that name such a key (they could come from its default).
            replaced = {f.key for f in parsed.findings if f.key and f.code != "extra_forbidden"}
            found = [f for f in found if not any(_names(f.rule, key) for key in replaced)]
        findings.extend(attach_positions(found, source, parsed.positions))
        findings.sort(key=Finding.sort_key)
    return Validation(source, parsed.model, findings, version, parsed.data)


def _names(text: str, key: str) -> bool:
    return re.search(rf"(?<![A-Za-z_]){re.escape(key)}(?![A-Za-z_])", text) is not None


def _salvage(data: dict[str, Any], problems: list[Finding]) -> Policy | None:
    """A policy without the keys that failed type checks, so that cross-field rules can still
    run and every problem is reported at once. None when nothing usable is left."""
    if not data or any(f.code in ("missing", "toml-syntax", "not-utf8") for f in problems):
        return None
    try:
        trimmed = copy.deepcopy(data)
    except RecursionError:  # an unknown key's value nested deeper than copying goes
        return None
    for f in problems:
        node: Any = trimmed
        for part in [p for p in f.table.split(".") if p]:
            node = (
                node[int(part)]
                if isinstance(node, list) and part.isdigit()
                else (node.get(part) if isinstance(node, dict) else None)
            )
        if f.key is None:
            return None
        if isinstance(node, dict):
            node.pop(f.key, None)
    try:
        return Policy.model_validate(trimmed)
    except ValueError:
        return None


def load_policy(path: Path | None, *, nvrx: NvrxChoice = "installed") -> Policy:
    """The validated policy at ``path``; raises ``ConfigError`` (with every finding) on errors."""
    result = validate_file(path, nvrx=nvrx)
    if result.policy is None or result.errors:
        raise ConfigError(result.source, result.findings)
    return result.policy


@dataclasses.dataclass(frozen=True)
class Setting:
    """One effective setting: where it lives, its value as TOML, and whether the file set it."""

    table: str
    key: str
    value: str
    from_file: bool


def effective_settings(policy: Policy, data: dict[str, Any]) -> list[Setting]:
    """Every key of ``policy`` with its effective value (defaults filled in)."""
    rows: list[Setting] = []
    _walk(policy, data, "", rows)
    return rows


def _walk(model: BaseModel, data: Any, table: str, rows: list[Setting]) -> None:
    given = data if isinstance(data, dict) else {}
    for name, info in type(model).model_fields.items():
        key = info.alias or name
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            _walk(value, given.get(key), f"{table}.{key}" if table else key, rows)
        elif key == "faults":
            shown = f"{len(value)} fault(s)" if value else "none"
            rows.append(Setting("", "faults", shown, key in given))
        else:
            if value is None:
                shown = "(not set)"
            elif is_duration_field(info.metadata):
                shown = toml_value(format_duration(value))
            else:
                shown = toml_value(value)
            rows.append(Setting(table, key, shown, key in given))

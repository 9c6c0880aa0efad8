"""Validate a policy file from end to end: read, parse, type-check, cross-check.

``validate_file`` never raises for bad input; ``load_policy`` is the strict entry point for
commands that need a usable policy, and raises ``ConfigError`` with every finding.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

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
    if parsed.model is not None:
        found = check(parsed.model, nvrx=version, timings=timings)
    else:
        salvaged = _salvage(parsed.data, parsed.findings)
        found = [] if salvaged is None else salvaged.findings(version, timings)
    if found:
        findings.extend(attach_positions(found, source, parsed.positions, parsed.data))
        findings.sort(key=Finding.sort_key)
    return Validation(source, parsed.model, findings, version, parsed.data)


def _names(text: str, key: str) -> bool:
    return re.search(rf"(?<![A-Za-z_]){re.escape(key)}(?![A-Za-z_])", text) is not None


_PLACEHOLDER_JOB = {"name": "my-job", "script": "train.py", "nproc_per_node": "gpu"}
"""What stands in for a missing ``[job]`` (``nproc_per_node = "gpu"``: no world size, so
nothing is checked against one)."""


@dataclasses.dataclass(frozen=True)
class _Salvaged:
    """A policy built from the parts of the data that validated, so that the cross-field
    rules still run and every independent problem is reported at once."""

    policy: Policy
    problems: list[Finding]
    replaced: frozenset[str]
    """Keys removed (their defaults stand in) or filled with placeholders."""
    placeholders: frozenset[str]
    """Tables that are placeholders as a whole (a missing ``[job]``)."""
    faults: tuple[int, ...]
    """The original index of each ``[[faults]]`` entry kept (entries with problems are dropped)."""

    def findings(self, nvrx: NvrxVersion | None, timings: Timings | None) -> list[Finding]:
        """The cross-field findings that involve only keys that validated."""
        bad = {(f.table, f.key) for f in self.problems}
        kept = []
        for f in check(self.policy, nvrx=nvrx, timings=timings):
            head, _, index = f.table.partition(".")
            if head == "faults" and index.isdigit():
                f = dataclasses.replace(f, table=f"faults.{self.faults[int(index)]}")
            if (f.table, f.key) in bad or f.table.split(".")[0] in self.placeholders:
                continue
            if f.key in self.replaced or any(_names(f.rule, key) for key in self.replaced):
                continue  # it could come from a default or a placeholder
            if any(f"[{table}]" in f.rule for table in self.placeholders):
                continue
            kept.append(f)
        return kept


def _salvage(data: dict[str, Any], problems: list[Finding]) -> _Salvaged | None:
    """The policy without the keys that failed their checks (a missing ``[job]`` or job name
    replaced by a placeholder, ``[[faults]]`` entries with problems left out). None when
    nothing usable is left."""
    if not data or any(f.code in ("toml-syntax", "not-utf8") for f in problems):
        return None
    try:
        trimmed = copy.deepcopy(data)
    except RecursionError:  # an unknown key's value nested deeper than copying goes
        return None
    replaced: set[str] = set()
    placeholders: set[str] = set()
    dropped_faults: set[int] = set()
    for f in problems:
        if f.key is None:
            return None
        head, _, index = f.table.partition(".")
        if head == "faults" and index.isdigit():
            dropped_faults.add(int(index))
        else:
            _trim(trimmed, f, replaced, placeholders)
    faults = trimmed.get("faults")
    kept = list(range(len(faults))) if isinstance(faults, list) else []
    if isinstance(faults, list) and dropped_faults:
        kept = [i for i in kept if i not in dropped_faults]
        trimmed["faults"] = [faults[i] for i in kept]
    try:
        policy = Policy.model_validate(trimmed)
    except ValueError:
        return None
    return _Salvaged(policy, problems, frozenset(replaced), frozenset(placeholders), tuple(kept))


def _trim(trimmed: dict[str, Any], f: Finding, replaced: set[str], placeholders: set[str]) -> None:
    """Take the key of finding ``f`` out of ``trimmed`` (a placeholder for a missing ``[job]``
    or a bad job name), noting in ``replaced`` the keys that rules may name."""
    assert f.key is not None
    if f.table == "" and f.key == "job" and f.code in ("missing", "model_type", "dict_type"):
        trimmed["job"] = dict(_PLACEHOLDER_JOB)
        placeholders.add("job")
        replaced.update(key for key in _PLACEHOLDER_JOB if key != "name")  # rules naming them
        return
    node: Any = trimmed
    for part in [p for p in f.table.split(".") if p]:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        return
    if f.table == "job" and f.key == "name":
        node["name"] = _PLACEHOLDER_JOB["name"]  # findings on it are dropped as on a bad key
        return
    if f.code != "extra_forbidden":
        replaced.add(f.key)
    node.pop(f.key, None)


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
            elif isinstance(value, float) and _is_duration(info):
                shown = toml_value(format_duration(value))
            elif isinstance(value, dict):  # [heartbeat.sections]: durations or "auto"
                shown = toml_value(
                    {k: format_duration(v) if isinstance(v, float) else v for k, v in value.items()}
                )
            else:
                shown = toml_value(value)
            rows.append(Setting(table, key, shown, key in given))


def _is_duration(info: FieldInfo) -> bool:
    """A ``Duration`` field, optional or not (``Duration | None``, ``Duration | Literal[...]``)."""
    return is_duration_field(info.metadata) or any(
        is_duration_field(list(getattr(arg, "__metadata__", ()))) for arg in typing.get_args(info.annotation)
    )

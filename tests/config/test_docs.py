"""The policy docs stay in step with the code.

``docs/policy.schema.json`` and the key reference in ``docs/policy.md`` are generated from the
policy model; the hand-written example and rule tables on the same page are checked against the
model and the rules, so that changing the schema without touching the docs fails here.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
from pydantic import BaseModel

from nvtrain.config import validate_source
from nvtrain.config.reference import BEGIN, END, key_reference, schema_json, update_docs
from nvtrain.config.schema import Policy
from nvtrain.nvrx import NvrxVersion

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGE = DOCS / "policy.md"
SCHEMA = DOCS / "policy.schema.json"
REGENERATE = "regenerate with `python -m nvtrain.config.reference docs` (from the repository root)"


def _page() -> str:
    assert PAGE.is_file(), f"{PAGE} is missing"
    return PAGE.read_text(encoding="utf-8")


def _generated(text: str) -> str:
    assert text.count(BEGIN) == 1 and text.count(END) == 1, (
        f"docs/policy.md must hold the marker lines {BEGIN!r} and {END!r} once each, in that order"
    )
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    assert start <= end, f"docs/policy.md: {END!r} comes before {BEGIN!r}"
    return text[start:end]


def _tables(model: type[BaseModel], prefix: str = "") -> dict[str, list[str]]:
    """Every table of the model (dotted name) with its plain keys, as written in TOML."""
    tables: dict[str, list[str]] = {prefix: []} if prefix else {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        inner = _model_in(info.annotation)
        if inner is None:
            tables.setdefault(prefix, []).append(key)
        else:
            tables.update(_tables(inner, f"{prefix}.{key}" if prefix else key))
    return tables


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def test_schema_file_is_current() -> None:
    assert SCHEMA.is_file(), f"docs/policy.schema.json is missing: {REGENERATE}"
    assert SCHEMA.read_text(encoding="utf-8") == schema_json(), (
        f"docs/policy.schema.json differs from the policy model: {REGENERATE}"
    )


def test_key_reference_is_current() -> None:
    assert _generated(_page()).strip() == key_reference().strip(), (
        f"the key reference in docs/policy.md differs from the policy model: {REGENERATE}"
    )


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    shutil.copy(PAGE, tmp_path / "policy.md")
    shutil.copy(SCHEMA, tmp_path / "policy.schema.json")
    changed = [p.name for p in update_docs(tmp_path)]
    assert changed == [], f"regenerating would rewrite {', '.join(changed)}: {REGENERATE}"


@pytest.mark.parametrize(("table", "keys"), sorted(_tables(Policy).items()))
def test_every_key_is_in_the_reference(table: str, keys: list[str]) -> None:
    section = _generated(_page())
    header = f"### `[[{table}]]`" if table == "faults" else f"### `[{table}]`"
    assert header in section, f"docs/policy.md has no {header} section: {REGENERATE}"
    body = section.split(header, 1)[1].split("\n### ", 1)[0]
    missing = [k for k in keys if f"| `{k}` |" not in body]
    assert not missing, f"docs/policy.md [{table}] lacks {missing}: {REGENERATE}"


def _example() -> str:
    after = _page().split("## A complete example", 1)
    assert len(after) == 2, "docs/policy.md lost its '## A complete example' section"
    block = re.search(r"```toml\n(.*?)```", after[1], re.DOTALL)
    assert block, "docs/policy.md: no ```toml block under '## A complete example'"
    return block.group(1)


@pytest.mark.parametrize("nvrx", ["0.4.1", "0.7.0"])
def test_example_policy_is_valid(nvrx: str) -> None:
    result = validate_source(_example(), "docs/policy.md example", nvrx=NvrxVersion.parse(nvrx))
    bad = [f"{f.severity} {f.code} {f.where}: {f.rule}" for f in result.findings if f.severity != "info"]
    assert result.policy is not None and not bad, f"the example in docs/policy.md has findings: {bad}"


def test_example_policy_is_complete() -> None:
    """Every key is written in the example (commented out where it excludes another)."""
    written: set[tuple[str, str]] = set()
    table = ""
    for line in _example().splitlines():
        header = re.match(r"^\s*\[\[?\s*([\w.]+)\s*\]\]?", line)
        if header:
            table = header.group(1)
            continue
        assign = re.match(r"^\s*#?\s*(\w+)\s*=", line)
        if assign:
            written.add((table, assign.group(1)))
    missing = [f"[{t}] {k}" for t, keys in _tables(Policy).items() for k in keys if (t, k) not in written]
    assert not missing, f"the complete example in docs/policy.md lacks {missing}; add them with a comment"


def _finding_codes(path: Path) -> set[str]:
    """Codes of findings built in ``path``: calls whose first two arguments are a severity and
    a code, e.g. ``_f("error", "dns-name", ...)`` or ``Finding("info", "nvrx-missing", ...)``."""
    codes = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and len(node.args) >= 2:
            severity, code = node.args[0], node.args[1]
            if (
                isinstance(severity, ast.Constant)
                and severity.value in ("error", "warning", "info")
                and isinstance(code, ast.Constant)
                and isinstance(code.value, str)
            ):
                codes.add(code.value)
    return codes


def test_every_rule_code_is_documented() -> None:
    config = ROOT / "src" / "nvtrain" / "config"
    codes = _finding_codes(config / "validation.py").union(*map(_finding_codes, config.glob("checks*.py")))
    assert codes, "found no finding codes in config/checks.py; has the way findings are built changed?"
    hand_written = _page().split(BEGIN, 1)[0]
    missing = sorted(c for c in codes if f"`{c}`" not in hand_written)
    assert not missing, f"docs/policy.md does not describe the finding codes {missing}"

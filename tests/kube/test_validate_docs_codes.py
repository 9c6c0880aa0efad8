"""Every finding code that ``nvtrain validate --manifest`` can report is documented in
docs/validate.md's section "Checking a rendered manifest".

The codes are read from the source of ``src/nvtrain/kube/`` (by ``ast``, nothing imported):
the second argument of each call whose first is a severity (``checker.finding("error",
"manifest-api", ...)``, ``Finding(...)``), a string or a name bound to one at the module's top
(``CODE = "manifest-monitoring"``), or either branch of a conditional (``"too-nested" if deep
else "too-large"``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "src" / "nvtrain" / "kube"
SEVERITIES = ("error", "warning", "info")
CODE = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)+")


def _is_severity(node: ast.expr) -> bool:
    if isinstance(node, ast.IfExp):
        return _is_severity(node.body) and _is_severity(node.orelse)
    return (
        isinstance(node, ast.Name)
        and node.id == "severity"
        or (isinstance(node, ast.Constant) and node.value in SEVERITIES)
    )


def _strings(node: ast.expr, names: dict[str, str]) -> list[str]:
    if isinstance(node, ast.IfExp):
        return _strings(node.body, names) + _strings(node.orelse, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in names:
        return [names[node.id]]
    return []


def _codes(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {
        target.id: statement.value.value
        for statement in tree.body
        if isinstance(statement, ast.Assign)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
        for target in statement.targets
        if isinstance(target, ast.Name)
    }
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and len(node.args) >= 2 and _is_severity(node.args[0]):
            found.update(c for c in _strings(node.args[1], names) if CODE.fullmatch(c))
    return found


def _section() -> str:
    page = (ROOT / "docs" / "validate.md").read_text(encoding="utf-8")
    start = page.index("\n## Checking a rendered manifest\n")
    end = page.find("\n## ", start + 1)
    return page[start:end]


def test_every_manifest_finding_code_is_documented_in_validate_md() -> None:
    codes = set().union(*map(_codes, sorted(KUBE.glob("*.py"))))
    # The collector still sees the ways findings are built (else the test would pass on nothing).
    assert {"manifest-api", "manifest-monitoring", "manifest-mismatch", "too-large"} <= codes, codes
    section = _section()
    missing = sorted(c for c in codes if f"`{c}`" not in section)
    assert not missing, (
        f"docs/validate.md, 'Checking a rendered manifest', does not name the finding codes {missing}: "
        "add each with its severity, what it means and the fix"
    )

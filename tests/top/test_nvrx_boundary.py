"""The NVRx boundary: outside ``nvtrain/nvrx/`` no module imports NVRx or spells its import name.

Every contact with NVRx (imports, module names run as programs, classes recognised by their
module) goes through the boundary package, where each version's contract is recorded and checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nvtrain

SRC = Path(nvtrain.__file__).resolve().parent
BOUNDARY = SRC / "nvrx"
NAME = "nvidia_resiliency_ext"


def touches(path: Path) -> list[str]:
    """Where ``path`` imports NVRx or holds its import name in a string: ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if NAME in node.value else []
        found += [f"{node.lineno}: {n[:80]!r}" for n in names if n == NAME or NAME in n]
    return found


def test_only_the_boundary_touches_nvrx() -> None:
    outside = {
        str(p.relative_to(SRC)): hits
        for p in sorted(SRC.rglob("*.py"))
        if BOUNDARY not in p.parents and (hits := touches(p))
    }
    assert outside == {}, f"NVRx named outside src/nvtrain/nvrx/ (move it into the boundary): {outside}"


def test_the_check_sees_an_import_and_a_name(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f():\n    from nvidia_resiliency_ext import inprocess\n"
        "MODULE = 'nvidia_resiliency_ext.fault_tolerance.launcher'\n",
        encoding="utf-8",
    )
    assert [hit.split(":")[0] for hit in touches(sample)] == ["2", "3"]


def test_the_boundary_itself_names_nvrx() -> None:
    assert any(touches(p) for p in BOUNDARY.rglob("*.py"))

"""docs/integrations.md: every Python example parses, and every ``nvhf.``, ``nvpl.`` and
``nvacc.`` name it uses is in that integration module's ``__all__`` (read from the source, so
no framework is imported here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "integrations.md"
MODULES = {"nvhf": "hf", "nvpl": "lightning", "nvacc": "accelerate"}


def _exported(module: str) -> set[str]:
    tree = ast.parse((ROOT / "src" / "nvtrain" / "integrations" / f"{module}.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{module}.py has no __all__")


def test_every_example_parses_and_uses_exported_names_only() -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) == 3, "one example per framework"
    used: dict[str, set[str]] = {alias: set() for alias in MODULES}
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in MODULES
            ):
                used[node.value.id].add(node.attr)
    for alias, module in MODULES.items():
        assert used[alias], f"no example uses {alias}"
        assert used[alias] <= _exported(module), (alias, used[alias] - _exported(module))

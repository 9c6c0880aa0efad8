"""nvtrain's import graph has no cycle: not between modules, not between its packages.

Every import counts, wherever it sits (module level, inside a function, under
``TYPE_CHECKING``): an import moved into a function still makes the two modules depend on each
other. Importing ``a.b.c`` also runs ``a/b/__init__.py``, so it depends on that package too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

import nvtrain

SRC = Path(nvtrain.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, name: str, is_package: bool) -> Iterable[str]:
    """Every module name ``tree`` imports (a ``from m import x`` names ``m.x`` too: it may be a
    module)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def module_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        own_parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        deps: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for target in imported(tree, name, path.name == "__init__.py"):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # the module and every package above it
                dep = ".".join(parts[:i])
                if dep in paths and dep != name and dep not in own_parents:
                    deps.add(dep)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``nvtrain.config.load`` -> ``config``; ``nvtrain.errors`` -> ``errors``."""

    def top(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else None

    packages: dict[str, set[str]] = {}
    for module, deps in graph.items():
        source = top(module)
        if source is None:
            continue
        edges = packages.setdefault(source, set())
        edges.update(t for d in deps if (t := top(d)) is not None and t != source)
    return packages


def test_no_module_imports_itself_around_a_cycle() -> None:
    assert cycles(module_graph()) == []


def test_no_cycle_between_packages() -> None:
    assert cycles(package_graph(module_graph())) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_cycles_finds_them(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_graph_sees_imports_inside_functions_and_parent_packages() -> None:
    graph = module_graph()
    # cli/validate.py imports nvtrain.config.validation inside its command function.
    assert "nvtrain.config.validation" in graph["nvtrain.cli.validate"]
    assert "nvtrain.config" in graph["nvtrain.cli.validate"]
    # A submodule never depends on its own package's __init__ (that one is already running).
    assert "nvtrain.events" not in graph["nvtrain.events.read"]

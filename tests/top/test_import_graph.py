"""nvtrain's import graph: no cycle, not between modules, not between its packages; and every
import between packages is one that the layering (``ALLOWED``) permits.

Every import counts, wherever it sits (module level, inside a function, under
``TYPE_CHECKING``): an import moved into a function still makes the two modules depend on each
other. Importing ``a.b.c`` also runs ``a/b/__init__.py``, so it depends on that package too.

The layering table of docs/architecture.md is rendered from ``ALLOWED``; after changing the
table, rewrite it with ``.venv/bin/python tests/top/test_import_graph.py``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

import nvtrain

SRC = Path(nvtrain.__file__).resolve().parent
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

# Which package may import which (a top-level module counts as a package: ``errors`` is
# nvtrain/errors.py). Derived from the code, then checked to be a layering: the library never
# imports ``cli``; what reads or writes the events log (``events``, ``runlog``, ``report``,
# ``live``) never imports ``launcher``; ``kube`` never imports ``launcher``; the table has no
# cycle. A new edge is a design decision: add it here, then regenerate the docs (see above).
ALLOWED: dict[str, frozenset[str]] = {
    name: frozenset(targets.split())
    for name, targets in {
        "__main__": "cli",
        "cli": "atomic config errors events findings kube launcher nvrx report tuning",
        "launcher": "config entry errors events findings kubenames live nvrx private runlog",
        "kube": "config errors findings kubenames nvrx",
        "tuning": "atomic config errors events findings runlog",
        "live": "config events report runlog",
        "report": "atomic errors events runlog",
        "runlog": "errors events",
        "integrations": "errors worker",
        "demo": "worker",
        "worker": "config entry errors events nvrx private storesocket",
        "zygote": "entry nvrx private",
        "config": "errors findings kubenames nvrx",
        "kubenames": "errors",
        "errors": "findings",
        "events": "private",
        "findings": "",
        "nvrx": "entry errors findings private storesocket",
        "private": "",
        "storesocket": "",
        "atomic": "",
        "entry": "",
    }.items()
}
# Files in folders without an ``__init__.py`` are data that nvtrain ships, not modules of the
# library: ``kube/starter/train.py`` is the user's training script that ``nvtrain init`` writes,
# and imports what such a script imports (``nvtrain.worker``).
NOT_LIBRARY = ("nvtrain.kube.starter.",)
LAYERS_BEGIN = "<!-- layers: generated from ALLOWED in tests/top/test_import_graph.py; do not edit -->"
LAYERS_END = "<!-- /layers -->"


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


# -- the layering ------------------------------------------------------------------------------


def library_package_graph() -> dict[str, set[str]]:
    graph = {m: d for m, d in module_graph().items() if not m.startswith(NOT_LIBRARY)}
    return package_graph(graph)


def test_every_import_between_packages_is_an_allowed_edge() -> None:
    graph = library_package_graph()
    unknown = sorted(set(graph) - set(ALLOWED))
    assert unknown == [], f"packages with no row in ALLOWED (tests/top/test_import_graph.py): {unknown}"
    extra = {p: sorted(targets - ALLOWED[p]) for p, targets in graph.items() if targets - ALLOWED[p]}
    assert extra == {}, (
        f"imports that the layering does not allow: {extra}. Import from a lower layer, or, if the "
        "design changes, add the edge to ALLOWED and regenerate docs/architecture.md "
        "(.venv/bin/python tests/top/test_import_graph.py)"
    )


def test_the_allowed_edges_are_a_layering() -> None:
    assert cycles({p: set(t) for p, t in ALLOWED.items()}) == []
    assert all(t <= set(ALLOWED) for t in ALLOWED.values()), "an edge to a package with no row"
    assert {p for p, t in ALLOWED.items() if "cli" in t} == {"__main__"}, "the library imports cli"
    for reader in ("events", "runlog", "report", "live", "kube"):
        assert "launcher" not in ALLOWED[reader], reader
    assert set(ALLOWED) == set(library_package_graph()), "a row of ALLOWED names no package"


def layers(allowed: dict[str, frozenset[str]]) -> list[str]:
    """The packages from the top layer down: by the longest import chain below each, then name."""
    height: dict[str, int] = {}

    def below(name: str) -> int:
        if name not in height:
            height[name] = 1 + max((below(t) for t in allowed[name]), default=-1)
        return height[name]

    return sorted(allowed, key=lambda name: (-below(name), name))


def render_layers(allowed: dict[str, frozenset[str]]) -> str:
    """The table docs/architecture.md shows between LAYERS_BEGIN and LAYERS_END."""
    rows = [LAYERS_BEGIN, "", "| package | may import |", "|---|---|"]
    order = layers(allowed)
    for name in order:
        targets = ", ".join(f"`{t}`" for t in sorted(allowed[name], key=order.index))
        rows.append(f"| `{name}` | {targets or 'nothing of nvtrain'} |")
    return "\n".join([*rows, "", LAYERS_END])


def documented_layers(text: str) -> str | None:
    start, end = text.find(LAYERS_BEGIN), text.find(LAYERS_END)
    return text[start : end + len(LAYERS_END)] if 0 <= start < end else None


def test_the_docs_show_the_allowed_edges() -> None:
    assert documented_layers(ARCHITECTURE.read_text(encoding="utf-8")) == render_layers(ALLOWED), (
        "docs/architecture.md's layering table is not the one ALLOWED renders: rewrite it with "
        ".venv/bin/python tests/top/test_import_graph.py"
    )


def test_layers_put_every_package_above_what_it_imports() -> None:
    order = layers(ALLOWED)
    assert order[0] == "__main__" and order.index("cli") < order.index("launcher")
    assert all(order.index(p) < order.index(t) for p, targets in ALLOWED.items() for t in targets)


def write_docs() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    old = documented_layers(text)
    if old is None:
        sys.exit(f"{ARCHITECTURE}: no {LAYERS_BEGIN!r} ... {LAYERS_END!r} block to rewrite")
    ARCHITECTURE.write_text(text.replace(old, render_layers(ALLOWED)), encoding="utf-8")
    print(f"rewrote the layering table of {ARCHITECTURE}")


if __name__ == "__main__":
    write_docs()

"""Checks a contract against NVRx's source without importing it: ``ast`` over its ``.py`` files,
read from a folder (an installed ``site-packages``, an extracted copy) or straight out of a
wheel's zip, so that a release whose wheel does not install here (NVRx 0.7: glibc 2.39,
Python 3.12) is checked all the same.
"""

from __future__ import annotations

import ast
import zipfile
from collections.abc import Iterable
from pathlib import Path

from nvtrain.nvrx.contracts.facts import Calls, Fact, Name, Signature, Text

__all__ = ["SourceTree", "broken_facts"]


class SourceTree:
    """The ``.py`` files of an NVRx release: under ``root`` (the folder that holds
    ``nvidia_resiliency_ext/``) or in a wheel (a ``.whl`` file)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._zip = zipfile.ZipFile(root) if root.is_file() else None
        self._texts: dict[str, str | None] = {}
        self._trees: dict[str, ast.Module | None] = {}

    def _read(self, relative: str) -> str | None:
        if self._zip is not None:
            try:
                return self._zip.read(relative).decode("utf-8")
            except KeyError:
                return None
        path = self.root / relative
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def text(self, module: str) -> str | None:
        """The source of ``module`` (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``), or None."""
        if module not in self._texts:
            base = module.replace(".", "/")
            found = self._read(base + ".py")
            self._texts[module] = found if found is not None else self._read(base + "/__init__.py")
        return self._texts[module]

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            text = self.text(module)
            self._trees[module] = None if text is None else ast.parse(text)
        return self._trees[module]


def _binds(node: ast.stmt, name: str) -> bool:
    """Whether the statement ``node`` itself binds ``name``."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name == name
    if isinstance(node, ast.Import | ast.ImportFrom):
        return any((alias.asname or alias.name.partition(".")[0]) == name for alias in node.names)
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    names = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
    return any(isinstance(t, ast.Name) and t.id == name for t in names)


def _bound(body: Iterable[ast.stmt], name: str) -> ast.AST | None:
    """The statement of ``body`` (not nested in another scope) that binds ``name``."""
    for node in body:
        if _binds(node, name):
            return node
        inner: list[ast.stmt] = []
        if isinstance(node, ast.If | ast.Try | ast.With):  # names bound conditionally count
            inner = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                inner += handler.body
        found = _bound(inner, name) if inner else None
        if found is not None:
            return found
    return None


def _nested(function: ast.AST, name: str) -> ast.AST | None:
    """A function named ``name`` defined anywhere inside ``function``."""
    for node in ast.walk(function):
        if (
            node is not function
            and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name == name
        ):
            return node
    return None


def _resolve(tree: ast.Module, path: str) -> ast.AST | None:
    node: ast.AST | None = tree
    for part in path.split("."):
        if isinstance(node, ast.Module | ast.ClassDef):
            node = _bound(node.body, part)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node = _nested(node, part)
        else:
            return None
        if node is None:
            return None
    return node


def _params(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args)]
    if args.vararg:
        names.append("*" + args.vararg.arg)
    names += [a.arg for a in args.kwonlyargs]
    if args.kwarg:
        names.append("**" + args.kwarg.arg)
    return names


def _calls(function: ast.AST, call: str, argument: str | None) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == call:
            if argument is None or (node.args and ast.unparse(node.args[0]) == argument):
                return True
    return False


def _why(fact: Fact, tree: SourceTree) -> str | None:
    """Why ``fact`` does not hold in ``tree``, or None when it holds."""
    if isinstance(fact, Text):
        text = tree.text(fact.module)
        if text is None:
            return "the module is missing"
        return None if fact.text in text else "the text is not in it"
    module = tree.tree(fact.module)
    if module is None:
        return "the module is missing"
    node = _resolve(module, fact.path)
    if node is None:
        return f"{fact.path} is missing"
    if isinstance(fact, Name):
        return None
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return f"{fact.path} is not a function"
    if isinstance(fact, Signature):
        params = _params(node)
        ok = params == list(fact.params) if fact.exact else set(fact.params) <= set(params)
        return None if ok else f"it takes ({', '.join(params)})"
    assert isinstance(fact, Calls)
    return None if _calls(node, fact.call, fact.argument) else "the call is not in it"


def broken_facts(facts: Iterable[Fact], root: Path) -> list[str]:
    """The facts that do not hold in the NVRx source at ``root`` (a folder or a wheel), each in
    words: the fact, then why; empty when the contract holds."""
    tree = SourceTree(root)
    broken = []
    for fact in facts:
        why = _why(fact, tree)
        if why is not None:
            broken.append(f"{fact}: {why}")
    return broken

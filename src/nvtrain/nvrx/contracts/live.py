"""Checks facts on the imported NVRx modules, as ``nvtrain.nvrx.ftmain`` does before it patches:
attributes, ``inspect.signature`` and the names a function's code refers to. No source is read,
so a check costs well under a millisecond a fact. Only :class:`Name`, :class:`Signature` and
:class:`Calls` facts are checked here (a :class:`Text` fact holds or not in the source only:
``contracts.source``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Iterable
from typing import Any

from nvtrain.nvrx.contracts.facts import Calls, Fact, Name, Signature

__all__ = ["broken_live"]

_MISSING = object()


def _inner_code(code: types.CodeType, name: str) -> types.CodeType | None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name:
                return const
            found = _inner_code(const, name)
            if found is not None:
                return found
    return None


def _resolve(module: types.ModuleType, path: str) -> Any:
    """The object ``path`` names in ``module``: attributes, then (inside a function) the code
    of a function defined in it."""
    obj: Any = module
    for part in path.split("."):
        code = getattr(obj, "__code__", None) if not isinstance(obj, type) else None
        if isinstance(obj, types.CodeType) or isinstance(code, types.CodeType):
            obj = _inner_code(obj if isinstance(obj, types.CodeType) else code, part)  # type: ignore[arg-type]
            if obj is None:
                return _MISSING
        else:
            obj = inspect.getattr_static(obj, part, _MISSING)
            if isinstance(obj, staticmethod | classmethod):
                obj = obj.__func__
            if obj is _MISSING:
                return _MISSING
    return obj


def _code(obj: Any) -> types.CodeType | None:
    if isinstance(obj, types.CodeType):
        return obj
    code = getattr(obj, "__code__", None)
    return code if isinstance(code, types.CodeType) else None


def _why(fact: Fact) -> str | None:
    if not isinstance(fact, Name | Signature | Calls):
        return None
    module = sys.modules.get(fact.module)
    if module is None:
        try:
            module = importlib.import_module(fact.module)
        except ImportError:  # an NVRx without the module: the fact does not hold
            return "the module does not import"
    obj = _resolve(module, fact.path)
    if obj is _MISSING:
        return f"{fact.path} is missing"
    if isinstance(fact, Name):
        return None
    if isinstance(fact, Signature):
        try:
            params = list(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            return f"{fact.path} has no signature"
        ok = params == list(fact.params) if fact.exact else set(fact.params) <= set(params)
        return None if ok else f"it takes ({', '.join(params)})"
    code = _code(obj)
    if code is None:
        return f"{fact.path} is not a function"
    words = fact.call.split(".")
    names_ok = all(word in code.co_names for word in words)
    arg_ok = fact.argument is None or fact.argument in (*code.co_varnames, *code.co_freevars, *code.co_names)
    return None if names_ok and arg_ok else "the call is not in it"


def broken_live(facts: Iterable[Fact]) -> list[tuple[Fact, str]]:
    """The facts that do not hold in the NVRx imported here, with why."""
    broken = []
    for fact in facts:
        why = _why(fact)
        if why is not None:
            broken.append((fact, why))
    return broken

"""Imported by ending_worker.py: ``keep(obj)`` keeps ``obj`` in this module, where only the
interpreter's finalization frees it, as it frees what a library keeps in its module (torch's
process groups, a logger's open file). ``AbortsWhenFreed`` aborts the process (SIGABRT) then;
``WarnsWhenAsked`` warns when asked for its ``__class__`` (as torch's deprecated ``reduce_op``)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

KEPT: list[object] = []


class AbortsWhenFreed:
    def __del__(self, abort: Callable[[], object] = os.abort) -> None:
        abort()


class WarnsWhenAsked:
    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: PLE0307
        warnings.warn("WarnsWhenAsked was asked for its class", FutureWarning, stacklevel=2)
        return type(self)


def keep(obj: T) -> T:
    KEPT.append(obj)
    return obj

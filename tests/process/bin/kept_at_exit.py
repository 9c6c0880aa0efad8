"""Imported by ending_worker.py: ``keep(obj)`` keeps ``obj`` in this module, where only the
interpreter's finalization frees it, as it frees what a library keeps in its module (torch's
process groups, a logger's open file). ``AbortsWhenFreed`` aborts the process (SIGABRT) then."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

KEPT: list[object] = []


class AbortsWhenFreed:
    def __del__(self, abort: Callable[[], object] = os.abort) -> None:
        abort()


def keep(obj: T) -> T:
    KEPT.append(obj)
    return obj

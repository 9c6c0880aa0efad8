"""Waiting for something to happen, never for some time to pass (CONTRIBUTING.md: tests
synchronise on events). ``wait_until`` looks at a condition until it holds or a deadline passes,
then fails the test naming what it waited for; the look is cheap (a file, a process's state, a
line in a log), so it is repeated often and the wait ends as soon as the event has happened.

Where a pipe, a socket or a ``threading.Event`` can say when the event happens, wait on that
instead (``readline``, ``recv``, ``Event.wait``, ``Popen.wait``): this helper is for states that
nothing announces.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["wait_until"]


def wait_until(
    condition: Callable[[], T],
    timeout: float,
    what: str,
    *,
    alive: Callable[[], bool] | None = None,
    detail: Callable[[], str] | None = None,
    interval: float = 0.02,
) -> T:
    """The first true value of ``condition()``, looked at every ``interval`` seconds.

    Fails (``AssertionError``) when ``timeout`` seconds pass first, or as soon as ``alive()``
    says that what should make the condition true has ended (a process that exited). The
    message names ``what`` and adds ``detail()`` (a log, a description), computed only then."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if alive is not None and not alive():
            # One last look: the event may have come just before the end.
            value = condition()
            if value:
                return value
            raise AssertionError(_message(f"ended before {what}", detail))
        if time.monotonic() >= deadline:
            raise AssertionError(_message(f"no {what} within {timeout:g} s", detail))
        time.sleep(interval)


def _message(head: str, detail: Callable[[], str] | None) -> str:
    return head if detail is None else f"{head}\n{detail()}"

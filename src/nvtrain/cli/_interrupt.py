"""Ctrl-C anywhere in the CLI: one line on stderr and exit 130 (128 + SIGINT), no traceback.

Imported before typer, so that an interrupt while the command's modules load ends the same way.
``main`` also notes every SIGINT (``watch``): a library that catches the ``KeyboardInterrupt``
and raises its own error instead (pydantic does while it builds the policy's validators) still
ends in exit 130.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import FrameType

__all__ = ["INTERRUPTED", "MESSAGE", "end", "interrupted", "received", "say_interrupted", "watch"]

INTERRUPTED = 128 + signal.SIGINT  # nvtrain.errors.signal_exit_code, without importing it
"""130: the exit code after SIGINT, as a shell reports a process stopped by it."""

MESSAGE = "nvtrain: interrupted (SIGINT)"

_received = [False]
_said = [False]


def say_interrupted() -> None:
    """Print the one line, once (stderr may already be closed: then print nothing)."""
    if _said[0]:
        return
    _said[0] = True
    with contextlib.suppress(Exception):
        sys.stderr.write(MESSAGE + "\n")
        sys.stderr.flush()


def interrupted() -> NoReturn:
    """Print the line and end the process with exit 130, at once (for ``main`` only).

    ``os._exit``, not ``SystemExit``: once a ``KeyboardInterrupt`` has passed through code run
    by ``exec`` or ``eval`` of a string (dataclasses and namedtuple build their methods so),
    ``python -m`` ends the process by re-raising SIGINT on itself after any ``SystemExit``. A
    shell shows 130 either way; a parent process would see "killed by SIGINT" instead of 130.
    """
    say_interrupted()
    end(INTERRUPTED)


def end(code: int) -> NoReturn:
    """Flush stdout and stderr and end the process with ``code``."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def received() -> bool:
    """Whether a SIGINT arrived while ``watch`` was on."""
    return _received[0]


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _received[0] = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def watch() -> Iterator[None]:
    """Note SIGINTs (and raise ``KeyboardInterrupt`` as Python's own handler does) while inside;
    a SIGINT handler that is not Python's default (ignored, or set by an embedding program) is
    left alone."""
    _received[0] = _said[0] = False
    try:
        installed = signal.getsignal(signal.SIGINT) is signal.default_int_handler
        if installed:
            signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread
        installed = False
    try:
        yield
    finally:
        _received[0] = _said[0] = False
        if installed:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGINT, signal.default_int_handler)

"""SIGTERM in a worker: stop, but first let the checkpoint in flight be committed.

ft_launcher sends SIGTERM to the workers in two situations, and they call for different waits:

- the pod is stopping (deletion, preemption: ``nvtrain run`` got SIGTERM or SIGINT and logged a
  ``signal`` event before passing it on): every rank is stopping, the save in flight can still
  be completed, and the policy's ``[job] stop_timeout`` is the time the workers have for it;
- a peer died and ft_launcher stops the healthy workers to restart them all: the dead rank's
  shard may never come, so the wait is the short one of a soft fault
  (:func:`nvtrain.worker.restart.settle_limit`), not to delay the restart.

The handler raises :class:`Stopped` in the main thread; the attempt settles the save on its way
out and :func:`nvtrain.worker.restart.run` turns it into exit 128 + signal. Only the first signal
counts: a second one must not interrupt the wait it started.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["Stopped", "install", "pod_is_stopping", "requested"]

_TAIL_BYTES = 64 * 1024


class Stopped(BaseException):
    """SIGTERM reached this worker (a BaseException, like KeyboardInterrupt: training code's
    ``except Exception`` must not swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class _State:
    signum: int | None = None
    since: float = 0.0


def requested() -> int | None:
    """The signal that asked this worker to stop, or None."""
    return _State.signum


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    if _State.signum is not None:
        return  # already stopping: let the wait finish
    _State.signum = signum
    raise Stopped(signum)


def install() -> bool:
    """Handle SIGTERM from now on (only possible in the main thread); True when installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    _State.signum = None
    _State.since = time.time()
    signal.signal(signal.SIGTERM, _on_signal)
    return True


def pod_is_stopping(events_path: Path | None, since: float | None = None) -> bool:
    """True when the launcher of this run logged a ``signal`` event since ``since`` (default:
    when :func:`install` ran): the SIGTERM is the pod's stop, not a restart of the workers."""
    if events_path is None:
        return False
    since = _State.since if since is None else since
    try:
        with events_path.open("rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL_BYTES))
            lines = f.read().splitlines()
    except OSError:
        return False
    for raw in reversed(lines):
        try:
            event: dict[str, Any] = json.loads(raw)
        except ValueError:
            continue  # the first, cut line of the tail, or a torn one
        if float(event.get("ts", 0.0)) < since:
            return False
        if event.get("event") == "signal" and event.get("source") == "launcher":
            return True
    return False

"""SIGTERM in a worker: stop, but first let the checkpoint in flight be committed; then exit
within a bounded time, whatever the worker was doing.

ft_launcher sends SIGTERM to the workers in two situations, and they call for different waits:

- the pod is stopping (deletion, preemption: ``nvtrain run`` got SIGTERM or SIGINT and logged a
  ``signal`` event before passing it on): every rank is stopping, the save in flight can still
  be completed, and the policy's ``[job] stop_timeout`` is the time the workers have for it;
- a peer died and ft_launcher stops the healthy workers to restart them all: the dead rank's
  shard may never come, so the wait is the short one of a soft fault
  (:func:`nvtrain.worker.restart.settle_limit`), not to delay the restart.

Two paths lead out, and the first to finish wins:

- the main thread: the handler raises :class:`Stopped` there; the attempt settles the save on
  its way out and leaves through :func:`exit_now` (in-process restart) or ``SystemExit``;
- the stop watch: a thread woken by the signal itself (``signal.set_wakeup_fd``), which works
  while the main thread is blocked in C (a gloo or NCCL collective, a store barrier of NVRx's
  in-process restart) and Python handlers cannot run. It settles the save in flight too, gives
  the main thread :data:`GRACE` seconds more, then ends the process with ``os._exit``: no
  thread, barrier or helper of NVRx or nvtrain keeps a stopped worker alive.

Only the first signal counts: a second one must not interrupt the wait it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from nvtrain.events import parse_event
from nvtrain.events.records import SignalReceived

__all__ = ["GRACE", "Stopped", "exit_now", "exit_with", "install", "pod_is_stopping", "requested"]

_TAIL_BYTES = 64 * 1024

GRACE = 0.5
"""Seconds the stop watch gives the main thread after the save in flight settled."""

OnStop = Callable[[int], None]
"""Settles the save in flight for a stop by signal N (may block up to the stop's limit)."""
OnExit = Callable[[int, bool, float], None]
"""Records the stop (signal N, forced by the watch, seconds since the signal) before exit."""


class Stopped(BaseException):
    """SIGTERM reached this worker (a BaseException, like KeyboardInterrupt: training code's
    ``except Exception`` must not swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class _State:
    signum: int | None = None
    """The signal the main thread's handler took (it raised :class:`Stopped` for it)."""
    since: float = 0.0
    received: float | None = None
    """Monotonic time the first stop signal arrived (seen by either path)."""
    on_stop: OnStop | None = None
    on_exit: OnExit | None = None
    exit_lock = threading.Lock()
    watch: threading.Thread | None = None
    wake_fds: tuple[int, int] | None = None


_STOP_SIGNALS = (signal.SIGTERM,)


def requested() -> int | None:
    """The signal that asked this worker to stop, or None."""
    return _State.signum


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    if _State.received is None:
        _State.received = time.monotonic()
    if _State.signum is not None:
        return  # already stopping: let the wait finish
    _State.signum = signum
    raise Stopped(signum)


def exit_now(signum: int, *, forced: bool = False) -> None:
    """Record the stop once and end the process with 128 + ``signum``, skipping whatever else
    would wait (NVRx's exit barrier, non-daemon threads, atexit handlers). Never returns."""
    _State.exit_lock.acquire()  # the other path may be here already: it exits, this one waits
    received = _State.received if _State.received is not None else time.monotonic()
    if _State.on_exit is not None:
        with contextlib.suppress(BaseException):  # an unwritable log must not stop the exit
            _State.on_exit(signum, forced, time.monotonic() - received)
    _flush_and_exit(128 + signum)


def exit_with(code: int) -> None:
    """End the process with ``code`` at once (what was to be recorded is recorded), unless a
    stop is already ending it. Never returns."""
    _State.exit_lock.acquire()
    _flush_and_exit(code)


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


def _watch(read_fd: int, forward_fd: int) -> None:
    """The stop watch: wait for a stop signal's byte, settle, allow GRACE, exit."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        if forward_fd >= 0:  # a wakeup fd someone else had set keeps getting its bytes
            with contextlib.suppress(OSError):
                os.write(forward_fd, data)
        stops = [b for b in data if b in _STOP_SIGNALS]
        if stops:
            break
    signum = stops[0]
    if _State.received is None:
        _State.received = time.monotonic()
    if _State.on_stop is not None:
        with contextlib.suppress(BaseException):
            _State.on_stop(signum)
    time.sleep(GRACE)
    exit_now(signum, forced=True)


def install(on_stop: OnStop | None = None, on_exit: OnExit | None = None) -> bool:
    """Handle SIGTERM from now on (only possible in the main thread); True when installed.

    ``on_stop`` settles the save in flight (called from the stop watch, and possibly at the same
    time from the main thread's own way out: it must be safe to call twice); ``on_exit`` records
    the stop before :func:`exit_now` ends the process."""
    if threading.current_thread() is not threading.main_thread():
        return False
    _State.signum = None
    _State.received = None
    _State.since = time.time()
    _State.on_stop = on_stop
    _State.on_exit = on_exit
    signal.signal(signal.SIGTERM, _on_signal)
    if _State.watch is None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C-level handler must never block
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        _State.wake_fds = (read_fd, write_fd)
        _State.watch = threading.Thread(
            target=_watch, args=(read_fd, previous), name="nvtrain-stop-watch", daemon=True
        )
        _State.watch.start()
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
        event = parse_event(raw)
        if event is None:
            continue  # the first, cut line of the tail, or a torn one
        if event.ts < since:
            return False
        if isinstance(event, SignalReceived) and event.by_launcher:
            return True
    return False

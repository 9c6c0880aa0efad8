"""The worker command under a warm start: ``python -m nvtrain.zygote.client [-m MODULE | SCRIPT] ARGS``.

Asks the server named by ``$NVTRAIN_ZYGOTE`` for a worker forked from its warm interpreter,
stands in for it (signals passed on, its exit code or signal taken as this process's own), and
runs the script itself when no server answers. A server that is still importing keeps the
request in its socket's queue: the client waits for it (at most ``WAIT`` seconds), and starts
cold if the server refuses, dies or does not answer in time. A signal that comes before the
worker exists ends the client, as it would end a cold worker that is still importing; the server
tells the client the worker's pid before the worker runs anything, so once the worker has
printed a line, every signal reaches it. Imports the standard library only: it starts in a few
tens of milliseconds.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from typing import Any, NoReturn

from nvtrain.entry import Target, finish, parse, run
from nvtrain.zygote import ENV
from nvtrain.zygote.wire import Reader, send

__all__ = ["main"]

FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
    signal.SIGTSTP,
)

HELD = (signal.SIGCONT, signal.SIGTSTP)
"""Signals kept for the worker when they come before its pid is known; the others end the wait
(within ``POLL``): they go to the worker if its pid has come meanwhile, else they end the
client, as they would end a cold worker that is still importing (a worker the server forks for
a client that is gone is killed at once)."""

WAIT = 300.0
"""Seconds to wait for a server that is still importing (as long as a cold worker's imports take
on a loaded machine, with room to spare) before starting cold."""
POLL = 0.2
"""Seconds between looks at the signals that came while the client waits for its worker."""


def _cold(target: Target) -> NoReturn:
    """No server: run the script in this process, as ``python -m nvtrain.entry`` does."""
    finish(run(target))


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def _die_like(status: dict[str, object]) -> NoReturn:
    """End this process the way the worker ended: the same exit code, or the same signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    signum = status.get("signal")
    if isinstance(signum, int) and signum > 0:
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # these two cannot be handled
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
    code = status.get("exit")
    os._exit(code if isinstance(code, int) else 1)


def _wait_started(reader: Reader, pending: list[int]) -> dict[str, Any] | None:
    """The server's first reply (the forked worker's pid), or None: after ``WAIT`` seconds, or
    when a signal that ends the wait (not one of ``HELD``) is in ``pending`` and the reply has
    not come (a reply already there is taken: its worker may be running)."""
    deadline = time.monotonic() + WAIT
    while True:
        ending = any(signum not in HELD for signum in pending)
        left = deadline - time.monotonic()
        # 0: a look at what is there, without waiting
        reader.sock.settimeout(0 if ending else max(0.001, min(POLL, left)))
        try:
            return reader.read()
        except (TimeoutError, BlockingIOError):
            if ending or left <= 0:
                return None


def main(argv: list[str] | None = None) -> NoReturn:
    target = parse(list(sys.argv[1:] if argv is None else argv), prog="python -m nvtrain.zygote.client")
    path = os.environ.get(ENV, "")
    sock = _connect(path) if path else None
    if sock is None:
        _cold(target)
    # Signals that arrive before the worker's pid is known wait here (``_wait_started``).
    pending: list[int] = []
    pid: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if pid:
            try:
                os.kill(pid[0], signum)
            except ProcessLookupError:
                pass
        else:
            pending.append(signum)

    request = {
        "argv": target.argv,
        "script": target.script,
        "module": target.module,
        "cwd": os.getcwd(),
        "env": {**os.environ, "NVTRAIN_PID": str(os.getpid())},
    }
    reader = Reader(sock)
    # Installed before the request goes: once it is sent the server may fork the worker, and
    # the worker may print before this process runs again; a signal taken with the default
    # disposition then would end the client alone (and the server would kill the worker). From
    # here each signal is held or ends the wait, or reaches the worker.
    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        send(sock, request, [0, 1, 2])
        started = _wait_started(reader, pending)  # the server may still be importing
        sock.settimeout(None)
    except (OSError, ValueError):  # reset by a server that refused or died
        started = None
    if started is None or not isinstance(started.get("pid"), int):
        # No worker from the server (it stopped, refused, died or never answered, or a signal
        # came first): the connection's end takes any worker it forked late with it. The
        # signal ends this process; else it starts cold, with the signal dispositions a new
        # interpreter has (SIGINT raises KeyboardInterrupt).
        sock.close()
        for signum in FORWARDED:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        ending = next((signum for signum in pending if signum not in HELD), None)  # none comes now
        if ending is not None:
            _die_like({"signal": ending})
        _cold(target)
    pid.append(int(started["pid"]))
    for held in pending:
        forward(held, None)
    while True:
        status = reader.read()  # a forwarded signal does not interrupt it (PEP 475)
        if status is None:  # the server died: its worker must not outlive us
            try:
                os.kill(pid[0], signal.SIGKILL)
            except ProcessLookupError:
                pass
            print(f"nvtrain warm start: the server went away; worker {pid[0]} killed", file=sys.stderr)
            os._exit(1)
        if "exit" in status or "signal" in status:
            _die_like(status)


if __name__ == "__main__":
    main()

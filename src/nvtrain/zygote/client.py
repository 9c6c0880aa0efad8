"""The worker command under a warm start: ``python -m nvtrain.zygote.client [-m MODULE | SCRIPT] ARGS``.

Asks the server named by ``$NVTRAIN_ZYGOTE`` for a worker forked from its warm interpreter,
stands in for it (signals passed on, its exit code or signal taken as this process's own), and
runs the script itself when no server answers. A server that is still importing keeps the
request in its socket's queue: the client waits for it (at most ``WAIT`` seconds), and starts
cold if the server refuses, dies or does not answer in time. A signal that comes before the
worker exists ends the client, as it would end a cold worker that is still importing; the server
tells the client the worker's pid before the worker runs anything, so once the worker has
printed a line, every signal reaches it (through a pidfd: never a process that took the pid of
a worker already reaped).

Once the worker runs, the client watches the connection, the worker's pidfd and the server's
(its pid from ``SO_PEERCRED``). It ends with the server's word on the worker's end; when the
server is gone, with the status the worker wrote itself as it ended; and when the worker ended
without a word (killed outright) and no server is left to say how, with exit code 1 and one
line on stderr. The server's death alone ends nothing: the worker runs on. Imports the
standard library only: it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator
from typing import Any, NoReturn

from nvtrain.entry import Target, finish, parse, run
from nvtrain.zygote import ENV
from nvtrain.zygote.unixpath import reachable
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
        with reachable(path) as name:  # a path of any length (unixpath)
            sock.connect(name)
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
    pidfd: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if pid:
            with contextlib.suppress(OSError):  # it ended meanwhile
                if pidfd:  # never a process that took a reaped worker's pid
                    signal.pidfd_send_signal(pidfd[0], signum)
                else:
                    os.kill(pid[0], signum)
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
    worker = _pidfd(pid[0])
    if worker is not None:
        pidfd.append(worker)
    for held in pending:
        forward(held, None)
    _stand_in(reader, pid[0], worker, _server_pid(sock))


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (readable once it has ended), or None when it is gone already."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _server_pid(sock: socket.socket) -> int:
    """The pid of the process that listens on the socket's other end (0: not in this pid
    namespace)."""
    cred = struct.Struct("3i")
    server, _uid, _gid = cred.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, cred.size))
    return int(server)


def _stand_in(reader: Reader, pid: int, worker: int | None, server_pid: int) -> NoReturn:
    """Wait for the worker's end and take its status: the server's word (sent once it reaped
    the worker), else, with the server gone, the worker's own (``{"from": "worker"}``, written
    just before it exits). The worker keeps the server's end of the connection too: the server's
    death does not end it."""
    sock = reader.sock
    sock.setblocking(False)
    server = _pidfd(server_pid) if server_pid > 0 else None
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    for fd in (worker, server):
        if fd is not None:
            poller.register(fd, select.POLLIN)
    ended = worker is None
    # A server in another pid namespace (pid 0) is known to be gone only at the connection's end.
    server_gone = server_pid > 0 and server is None
    closed = False
    own: dict[str, Any] | None = None
    while True:
        if ended and server_gone and not closed:
            closed = not _drain(reader)  # nobody writes any more: all that was written is here
        own = _take_messages(reader, own)
        if ended and (server_gone or closed):
            _without_server(pid, own)
        if closed:
            # The server is gone and the worker closed its end: only the worker's exit is left.
            assert worker is not None
            select.select([worker], [], [])
            ended = True
            continue
        for fd, _event in poller.poll():
            if fd == worker:
                ended = True
            elif fd == server:
                server_gone = True
            elif not _drain(reader):
                closed = True
            else:
                continue
            poller.unregister(fd)


def _take_messages(reader: Reader, own: dict[str, Any] | None) -> dict[str, Any] | None:
    """Read the whole messages in the reader's buffer: the server's word on the worker's end
    ends this process alike (``_die_like``); the worker's own word is returned (else ``own``)."""
    for message in _messages(reader):
        if message.get("from") == "worker":
            own = message
        elif "exit" in message or "signal" in message:
            _die_like(message)
    return own


def _drain(reader: Reader) -> bool:
    """Take what is in the socket now; False at its end (or on more than a message may hold)."""
    try:
        while reader.feed():
            pass
    except BlockingIOError:
        return True
    except (OSError, ValueError):
        pass
    return False


def _messages(reader: Reader) -> Iterator[dict[str, Any]]:
    """The whole messages in the reader's buffer, lines that are none skipped."""
    while b"\n" in reader.buffer:
        with contextlib.suppress(ValueError):
            message = reader.message()
            if message is not None:
                yield message


def _without_server(pid: int, own: dict[str, Any] | None) -> NoReturn:
    """The worker ended and the server will not say how: end as the worker said it would, or,
    when it said nothing (killed outright), with exit code 1."""
    if own is None:
        sys.stderr.write(
            f"nvtrain warm start: the server is gone and worker {pid} ended without a word: killed; exit 1\n"
        )
        sys.stderr.flush()  # (os._exit flushes nothing)
        os._exit(1)
    how = f"signal {own['signal']}" if "signal" in own else f"exit code {own.get('exit')}"
    sys.stderr.write(f"nvtrain warm start: the server is gone; worker {pid} ended with {how}\n")
    _die_like(own)


if __name__ == "__main__":
    main()

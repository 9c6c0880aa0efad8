"""The warm-start server: ``python -m nvtrain.zygote.server --socket PATH [--script S | --module M]``.

Imports torch, NVRx, nvtrain's worker library and the training script's top-level imports,
checks that none of that initialised CUDA or started a thread, Python's or native
(``forkcheck``: a fork would then be unsafe: it refuses to serve, and every client starts
cold), then serves on ``PATH``. It binds ``PATH`` before the imports: a client that comes while
they run waits in the socket's queue and gets a forked worker when they are done (one import
per pod instead of one per worker), or, if the server refuses or dies, the connection closes
and the client starts cold. Per request it forks one worker: the child takes the client's
stdin/stdout/stderr, environment, working directory and argv, reseeds its random generators,
and runs the script as ``__main__``.

One thread, a selector over the socket, the connections and the workers' pidfds, and nothing
that blocks: a request is read as it comes (at most ``REQUEST_TIMEOUT`` seconds, one line of
JSON of at most ``wire.MAX_MESSAGE`` bytes, exactly three descriptors, fields of the right
types; else the connection and its descriptors are closed); a worker's end is sent to its client;
a client's end (it was killed) kills its worker. Either end may come first, or both in one
batch. Trouble nobody foresaw in one connection (a failed ``fork``, no descriptors left) drops
that connection with one line on stderr; the others are served on.

Only this user: the socket is bound at mode 0600 (under umask 0177), in a folder that
``nvtrain.private.check_private_dir`` accepts (else no socket at all: one line on stderr, and
every client starts cold), and a connection whose peer (``SO_PEERCRED``) is another user is
closed before anything is read from it.

A worker keeps the server's end of its client's connection and writes its status there as it
ends (``_tell``): should the server die, the worker runs on and its client still ends as the
worker did.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import os
import random
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from nvtrain.entry import Exit, Target, finish, run
from nvtrain.nvrx import names as nvrx_names
from nvtrain.private import check_private_dir
from nvtrain.zygote.forkcheck import fork_problem, os_threads
from nvtrain.zygote.unixpath import reachable
from nvtrain.zygote.wire import Reader, encode, send

__all__ = ["main", "script_imports"]

BASE = (
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    # The first optimizer a process builds imports this (torch.optim's compile checks): 1.6-2.3 s
    # of every warm worker's start on an H200 (benchmarks/recovery/restore_phases.py).
    "torch._dynamo",
    *nvrx_names.PRELOAD,
    "nvtrain.worker",
    "nvtrain.worker.hostcopy",
    "xxhash",
)
"""Imported by the server of a script that uses nvtrain's worker library: what such a worker
imports on its way to the first step, much of it inside functions."""

PLAIN = ("torch", "torch.distributed", "torch._dynamo")
"""Imported by the server of a script that does not use the worker library (``--plain``), before
the script's own imports: what every torchrun script imports on its way to its first step
(``torch._dynamo`` with its first optimizer, see ``BASE``), and nothing it would not."""

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""Set while the server imports: ``torch.cuda.is_available()`` called by an import then asks
NVML instead of initialising the CUDA driver, which would make every fork unable to use CUDA."""


def script_imports(source: str) -> list[str]:
    """The modules a script imports at its top level (absolute imports only), in order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return list(dict.fromkeys(names))


def _source(script: str | None, module: str | None) -> str:
    with contextlib.suppress(Exception):
        if script is not None:
            return Path(script).read_text(encoding="utf-8")
        if module is not None:
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.origin and spec.origin.endswith(".py"):
                return Path(spec.origin).read_text(encoding="utf-8")
    return ""


_stopping = False
"""Set by SIGTERM: an import it interrupts is not a module that failed to import."""


def _stop(_signum: int, _frame: object) -> None:
    global _stopping
    _stopping = True
    sys.exit(0)


def preload(script: str | None, module: str | None, plain: bool = False) -> tuple[list[str], int]:
    """Import what the workers will import; returns the names that failed to import (a worker
    imports them itself, and fails there if it must), and the threads of this process once the
    imports every worker makes were done (``forkcheck.fork_problem``'s base)."""
    if script is not None:
        sys.path.insert(0, str(Path(script).resolve().parent))
    os.environ.setdefault(NVML_CHECK, "1")  # the workers get their clients' environment
    failed = _import_all(PLAIN if plain else BASE)
    threads = os_threads()
    return failed + _import_all(script_imports(_source(script, module))), threads


def _import_all(names: Iterable[str]) -> list[str]:
    """Import ``names``; the ones that failed."""
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - anything a module does at import is its own
            if _stopping:  # SIGTERM came during this import: stop, not "failed to preload"
                raise
            failed.append(name)
    return failed


GO = b"g"
"""What the server writes to a forked worker once its client knows the worker's pid; a worker
that reads the end of the pipe instead (the server died, or the client is gone) runs nothing."""


def _child(request: dict[str, Any], fds: list[int], keep: int, closing: list[int], release: int) -> NoReturn:
    """In the forked worker: become the client's process and run the script; never returns.
    Nothing of the script runs before the server has told the client this process's pid
    (``GO`` on ``release``): a signal the client gets once the worker printed anything reaches
    the worker. ``keep`` is the server's end of the client's connection: the worker keeps it
    and, when the script is done, tells the client its status there itself (``_tell``), which
    the client uses should the server be gone by then."""
    end = Exit(1)
    me = os.getpid()
    kept = os.fstat(keep)
    try:
        if os.read(release, 1) != GO:
            os._exit(1)
        os.close(release)
        for fd in closing:
            with contextlib.suppress(OSError):
                os.close(fd)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False), line_buffering=True, write_through=unbuffered
        )
        sys.stderr = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), line_buffering=True, write_through=True
        )
        random.seed()
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.seed()
            # torch read OMP_NUM_THREADS when the server imported it; ft_launcher sets it per
            # worker (1 with several workers per node), as a cold worker's torch would see it.
            threads = env.get("OMP_NUM_THREADS", "")
            if threads.isdigit() and int(threads) > 0:
                torch.set_num_threads(int(threads))
        end = run(Target(request.get("script"), request.get("module"), list(request["argv"])), own_path=False)
    except Exception as exc:  # noqa: BLE001 - the setup failed: the worker ends as a failed start
        with contextlib.suppress(Exception):
            sys.stderr.write(f"nvtrain warm start: the worker could not start: {exc!r}\n")
    finally:
        if os.getpid() == me:  # not in a process the script forked that returned here
            _tell(keep, kept, end)
        finish(end)


def _tell(fd: int, kept: os.stat_result, end: Exit) -> None:
    """Write the worker's status to the client on ``fd``, if it is still the connection it was
    (the script may have closed it, and the number may be another file's now)."""
    with contextlib.suppress(OSError):
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) == (kept.st_dev, kept.st_ino):
            status: dict[str, Any] = {"signal": end.signal} if end.signal > 0 else {"exit": end.code}
            os.write(fd, encode({**status, "from": "worker"}))


def listen(path: str) -> socket.socket:
    """The server's socket, bound at ``path`` and listening: clients that connect before the
    server serves wait in its queue (their requests too: the kernel holds them). Its mode is
    0600 whatever the umask (only this user may connect), and it never appears half made."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for stale in (path, path + ".tmp"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
    umask = os.umask(0o177)  # one thread: nothing else makes files meanwhile
    try:
        with reachable(path + ".tmp") as name:  # a path of any length (unixpath)
            listener.bind(name)
    except OSError:
        listener.close()
        raise
    finally:
        os.umask(umask)
    listener.listen(BACKLOG)
    os.replace(path + ".tmp", path)
    return listener


BACKLOG = 256
"""Clients that can wait for the imports (a pod's workers: a few, at most a few dozen)."""
REQUEST_TIMEOUT = 5.0
"""Seconds a connection has to send its whole request once accepted (a client sends it at
once); then it is closed, with the descriptors it sent."""
MAX_PENDING = 64
"""Connections whose request is still coming; more wait in the socket's queue meanwhile."""
ACCEPT_PAUSE = 0.5
"""Seconds without accepting after ``accept`` failed (no descriptors left): the listener would
be ready again at once."""
_CRED = struct.Struct("3i")
"""``SO_PEERCRED``: pid, uid, gid."""


def _gone(conn: socket.socket) -> bool:
    """Whether the client hung up already (it waited in the queue, then stopped or gave up)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _request_problem(request: dict[str, Any], fds: list[int]) -> str | None:
    """Why ``request`` (and its descriptors) cannot be a worker's, or None."""
    argv, script, module = request.get("argv"), request.get("script"), request.get("module")
    env = request.get("env")
    if len(fds) != 3:
        return f"{len(fds)} descriptors, not 3"
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return "argv is not a list of strings"
    if not (isinstance(script, str) and module is None or isinstance(module, str) and script is None):
        return "not one script or one module"
    if not isinstance(request.get("cwd"), str):
        return "cwd is not a string"
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        return "env is not a mapping of strings"
    return None


@dataclasses.dataclass(eq=False)
class Conn:
    """One client's connection: its request while it comes, then its worker."""

    sock: socket.socket
    reader: Reader
    deadline: float
    """When a request that has not come whole is given up."""
    pid: int = 0
    """The worker's, once forked."""
    pidfd: int = -1
    """The worker's until it is reaped; -1 before and after."""
    closed: bool = False
    """The server's end of the connection is closed (the worker may keep its copy)."""


class Server:
    """One thread, a selector over the listener, the connections and the workers' pidfds. Each
    event is handled on its own: a connection that sends nothing, or garbage, or fails in a way
    nobody foresaw is closed, and the others are served meanwhile; the handlers of a worker's
    end and of its client's end each find what the other left, in either order."""

    def __init__(self, path: str, listener: socket.socket) -> None:
        self.path = path
        self.listener = listener
        listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.listening = False
        self.paused_until = 0.0
        self.accept_failed = False
        self.pending: set[Conn] = set()
        self.workers: dict[int, Conn] = {}
        self.refused_uids: set[int] = set()
        self._listen()

    def serve(self) -> NoReturn:
        while True:
            for key, _mask in self.selector.select(self._timeout()):
                kind, conn = key.data
                try:
                    if kind == "accept":
                        self._accept()
                    elif kind == "request":
                        self._request(conn)
                    elif kind == "worker":
                        self._ended(conn)
                    else:
                        self._client_event(conn)
                except Exception as exc:  # noqa: BLE001 - one connection's trouble ends that connection
                    sys.stderr.write(f"nvtrain warm start: dropped a connection ({kind}): {exc!r}\n")
                    if conn is not None:
                        self._drop(conn, reaped=kind == "worker")
            self._expire()
            self._listen()

    # -- the listener ---------------------------------------------------------------------------

    def _listen(self) -> None:
        """Accept while fewer than ``MAX_PENDING`` requests are coming and accept has not just
        failed."""
        want = len(self.pending) < MAX_PENDING and time.monotonic() >= self.paused_until
        if want and not self.listening:
            self.selector.register(self.listener, selectors.EVENT_READ, ("accept", None))
        elif not want and self.listening:
            self.selector.unregister(self.listener)
        self.listening = want

    def _timeout(self) -> float | None:
        """Seconds until the next deadline: a request's, or the end of a pause in accepting."""
        now = time.monotonic()
        times = [conn.deadline for conn in self.pending]
        if self.paused_until > now:
            times.append(self.paused_until)
        return max(0.0, min(times) - now) if times else None

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return
        except OSError as exc:  # no descriptor left (EMFILE, ENFILE, ENOBUFS): try again soon
            if not self.accept_failed:
                sys.stderr.write(f"nvtrain warm start: cannot accept now, retrying: {exc}\n")
            self.accept_failed = True
            self.paused_until = time.monotonic() + ACCEPT_PAUSE
            self._listen()
            return
        self.accept_failed = False
        try:
            _pid, uid, _gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        if uid != os.geteuid():  # the socket's mode keeps others out; a mode changed by hand does not
            sock.close()
            if uid not in self.refused_uids:  # one line per user, however often it tries
                self.refused_uids.add(uid)
                sys.stderr.write(
                    f"nvtrain warm start: refused the connections of uid {uid} (not this server's)\n"
                )
            return
        conn = Conn(sock, Reader(sock), time.monotonic() + REQUEST_TIMEOUT)
        self.pending.add(conn)
        self.selector.register(sock, selectors.EVENT_READ, ("request", conn))

    # -- a request ------------------------------------------------------------------------------

    def _request(self, conn: Conn) -> None:
        """Take what came on a connection whose request is coming; fork its worker once it
        is whole."""
        if conn not in self.pending:
            return
        try:
            if not conn.reader.feed():  # hung up before its request was whole
                self._drop(conn)
                return
            request = conn.reader.message()
        except BlockingIOError:
            return
        except (OSError, ValueError):
            self._drop(conn)
            return
        if request is None:
            return
        if _request_problem(request, conn.reader.fds) is not None or _gone(conn.sock):
            self._drop(conn)
            return
        self._fork(conn, request)

    def _fork(self, conn: Conn, request: dict[str, Any]) -> None:
        self.pending.discard(conn)
        self.selector.unregister(conn.sock)
        closing = [self.listener.fileno(), self.selector.fileno()]
        for other in (*self.pending, *self.workers.values()):
            closing += [other.sock.fileno(), other.pidfd, *other.reader.fds]
        closing = [fd for fd in closing if fd >= 0]
        release, released = os.pipe()
        try:
            pid = os.fork()
        except BaseException:
            os.close(release)
            os.close(released)
            raise
        if pid == 0:
            os.close(released)
            _child(request, conn.reader.fds, conn.sock.fileno(), closing, release)
        os.close(release)
        conn.pid = pid
        try:
            conn.reader.close_fds()
            conn.pidfd = os.pidfd_open(pid)
            self.workers[pid] = conn
            self.selector.register(conn.pidfd, selectors.EVENT_READ, ("worker", conn))
        except BaseException:
            # No go: the worker runs nothing; reaped here, or (watched) when its pidfd says so.
            os.close(released)
            if conn.pidfd < 0:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            self._close(conn)
            raise
        try:
            send(conn.sock, {"pid": pid})
        except OSError:  # the client went after its request: no go, its worker runs nothing
            os.close(released)
            self._close(conn)
            return
        self.selector.register(conn.sock, selectors.EVENT_READ, ("client", conn))
        with contextlib.suppress(OSError):
            os.write(released, GO)  # the worker starts the script now (``_child``)
        os.close(released)

    # -- a worker and its client ----------------------------------------------------------------

    def _ended(self, conn: Conn) -> None:
        """The worker's pidfd is readable: reap it, and tell its client how it ended (unless
        the client is gone already)."""
        if conn.pidfd < 0:
            return
        _, status = os.waitpid(conn.pid, 0)
        self._forget(conn)
        if conn.closed:
            return
        message = (
            {"signal": os.WTERMSIG(status)}
            if os.WIFSIGNALED(status)
            else {"exit": os.waitstatus_to_exitcode(status)}
        )
        with contextlib.suppress(OSError):
            send(conn.sock, message)
        self._close(conn)

    def _client_event(self, conn: Conn) -> None:
        """The connection of a client with a worker is readable: at its end (the client died)
        the worker is killed; it is reaped when its pidfd says it ended."""
        if conn.closed:
            return
        try:
            if conn.sock.recv(1 << 12):
                return  # a client sends nothing more: dropped
        except BlockingIOError:
            return
        except OSError:
            pass
        self._kill(conn)
        self._close(conn)

    # -- ends -----------------------------------------------------------------------------------

    def _kill(self, conn: Conn) -> None:
        if conn.pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(conn.pidfd, signal.SIGKILL)

    def _forget(self, conn: Conn) -> None:
        """Stop watching a reaped worker."""
        if conn.pidfd >= 0:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn.pidfd)
            os.close(conn.pidfd)
            conn.pidfd = -1
        if self.workers.get(conn.pid) is conn:
            del self.workers[conn.pid]

    def _close(self, conn: Conn) -> None:
        """Close the server's end of the connection and the descriptors that came on it."""
        self.pending.discard(conn)
        if not conn.closed:
            conn.closed = True
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn.sock)
            conn.sock.close()
        for fd in conn.reader.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        conn.reader.fds = []

    def _drop(self, conn: Conn, *, reaped: bool = False) -> None:
        """Give up a connection: close it, kill its worker (reaped when its pidfd says so, or
        here, after trouble in reaping it)."""
        self._kill(conn)
        self._close(conn)
        if reaped and conn.pidfd >= 0:
            with contextlib.suppress(OSError):
                os.waitpid(conn.pid, os.WNOHANG)
            self._forget(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self.pending if c.deadline <= now]:
            self._drop(conn)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nvtrain.zygote.server")
    parser.add_argument("--socket", required=True)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--script")
    target.add_argument("--module")
    parser.add_argument("--plain", action="store_true", help="the script does not use nvtrain.worker")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    folder = Path(args.socket).parent
    problem = check_private_dir(folder)
    if problem is not None:
        # Another user could replace the socket there (and take the clients' requests): no socket.
        sys.stderr.write(
            f"nvtrain warm start: off, workers start cold: the socket's folder {folder} {problem}\n"
        )
        signal.pause()
        return
    # Bound before the imports: the first workers wait for them instead of importing torch
    # each (a SIGKILL or a crash closes the socket, and they start cold).
    try:
        listener = listen(args.socket)
    except OSError as exc:
        sys.stderr.write(
            f"nvtrain warm start: off, workers start cold: cannot listen on {args.socket}: "
            f"{exc.strerror or exc} ([job] warm_start = false skips the server)\n"
        )
        signal.pause()
        return
    try:
        failed, threads = preload(args.script, args.module, plain=args.plain)
        if failed:
            sys.stderr.write(
                f"nvtrain warm start: not preloaded (the workers import them): {', '.join(failed)}\n"
            )
        unsafe = fork_problem(threads)
        if unsafe is not None:
            # Closing the socket drops the waiting clients' connections: they start cold.
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(args.socket)
            sys.stderr.write(
                f"nvtrain warm start: off, workers start cold: {unsafe} "
                "([job] warm_start = false skips the server)\n"
            )
            signal.pause()
            return
        Server(args.socket, listener).serve()
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(args.socket)


if __name__ == "__main__":
    main()

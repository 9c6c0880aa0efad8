"""The warm-start server: ``python -m nvtrain.zygote.server --socket PATH [--script S | --module M]``.

Imports torch, NVRx, nvtrain's worker library and the training script's top-level imports,
checks that none of that initialised CUDA or started a thread (a fork would then be unsafe:
it refuses to serve, and every client starts cold), then serves on ``PATH``. It binds ``PATH``
before the imports: a client that comes while they run waits in the socket's queue and gets a
forked worker when they are done (one import per pod instead of one per worker), or, if the
server refuses or dies, the connection closes and the client starts cold. Per request it
forks one worker: the child takes the client's stdin/stdout/stderr, environment, working
directory and argv, reseeds its random generators, and runs the script as ``__main__``. One
thread only, a selector over the socket, the clients' connections and the workers' pidfds: a
worker's end is sent to its client; a client's end (it was killed) kills its worker.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import os
import random
import selectors
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from nvtrain.entry import Exit, Target, finish, run
from nvtrain.zygote.wire import Reader, send

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
    "nvidia_resiliency_ext.fault_tolerance",
    "nvidia_resiliency_ext.inprocess",
    "nvtrain.worker",
    "nvtrain.worker.hostcopy",
    "xxhash",
)
"""Imported by every server: what a worker of nvtrain's library imports on its way to the first
step, much of it inside functions."""


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


def preload(script: str | None, module: str | None) -> list[str]:
    """Import what the workers will import; returns the names that failed to import (a worker
    imports them itself, and fails there if it must)."""
    failed = []
    if script is not None:
        sys.path.insert(0, str(Path(script).resolve().parent))
    for name in (*BASE, *script_imports(_source(script, module))):
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - anything a module does at import is its own
            if _stopping:  # SIGTERM came during this import: stop, not "failed to preload"
                raise
            failed.append(name)
    return failed


def fork_safe() -> str | None:
    """Why forking this interpreter would be unsafe, or None."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised while importing the script's modules"
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return f"importing the script's modules started threads ({names})"
    return None


def _child(request: dict[str, Any], fds: list[int], closing: list[int], release: int) -> NoReturn:
    """In the forked worker: become the client's process and run the script; never returns.
    Nothing of the script runs before the server has told the client this process's pid (the
    server closes ``release`` then): a signal the client gets once the worker printed anything
    reaches the worker."""
    end = Exit(1)
    try:
        os.read(release, 1)  # end of file once the server has sent the pid (or is gone)
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
    finally:
        # An exception of the setup above: the worker never ran; it ends as a failed start.
        finish(end)


def listen(path: str) -> socket.socket:
    """The server's socket, bound at ``path`` and listening: clients that connect before the
    server serves wait in its queue (their requests too: the kernel holds them)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener.bind(path + ".tmp")
    listener.listen(BACKLOG)
    os.replace(path + ".tmp", path)  # never a half-made socket at ``path``
    return listener


BACKLOG = 256
"""Clients that can wait for the imports (a pod's workers: a few, at most a few dozen)."""


def _gone(conn: socket.socket) -> bool:
    """Whether the client hung up already (it waited in the queue, then stopped or gave up)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class Server:
    def __init__(self, path: str, listener: socket.socket) -> None:
        self.path = path
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, ("accept", None))
        self.workers: dict[int, tuple[socket.socket, int]] = {}
        """pid -> (client connection, pidfd)."""

    def serve(self) -> None:
        while True:
            for key, _mask in self.selector.select():
                kind, item = key.data
                if kind == "accept":
                    self._accept()
                elif kind == "worker":
                    self._ended(item)
                else:
                    self._client_event(item)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        reader = Reader(conn)
        try:
            request = reader.read()
        except (OSError, ValueError):
            request = None
        if request is None or len(reader.fds) < 3 or _gone(conn):
            for fd in reader.fds:
                os.close(fd)
            conn.close()
            return
        closing = [self.listener.fileno(), conn.fileno(), self.selector.fileno()]
        closing += [c.fileno() for c, _ in self.workers.values()] + [p for _, p in self.workers.values()]
        release, released = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(released)
            _child(request, reader.fds, closing, release)
        os.close(release)
        for fd in reader.fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.workers[pid] = (conn, pidfd)
        self.selector.register(pidfd, selectors.EVENT_READ, ("worker", pid))
        self.selector.register(conn, selectors.EVENT_READ, ("client", pid))
        with contextlib.suppress(OSError):
            send(conn, {"pid": pid})
        os.close(released)  # the worker starts the script now (``_child``)

    def _ended(self, pid: int) -> None:
        _, status = os.waitpid(pid, 0)
        conn, pidfd = self.workers.pop(pid)
        self.selector.unregister(pidfd)
        if conn.fileno() in self.selector.get_map():  # not when its client went first
            self.selector.unregister(conn)
        os.close(pidfd)
        message = (
            {"signal": os.WTERMSIG(status)}
            if os.WIFSIGNALED(status)
            else {"exit": os.waitstatus_to_exitcode(status)}
        )
        with contextlib.suppress(OSError):
            send(conn, message)
        conn.close()

    def _client_event(self, pid: int) -> None:
        conn, _ = self.workers[pid]
        try:
            data = conn.recv(1024)
        except OSError:
            data = b""
        if not data:  # the client is gone (killed): so is its worker
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.selector.unregister(conn)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nvtrain.zygote.server")
    parser.add_argument("--socket", required=True)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--script")
    target.add_argument("--module")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    # Bound before the imports: the first workers wait for them instead of importing torch
    # each (a SIGKILL or a crash closes the socket, and they start cold).
    listener = listen(args.socket)
    try:
        failed = preload(args.script, args.module)
        if failed:
            print(
                f"nvtrain warm start: not preloaded (the workers import them): {', '.join(failed)}",
                file=sys.stderr,
            )
        unsafe = fork_safe()
        if unsafe is not None:
            # Closing the socket drops the waiting clients' connections: they start cold.
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(args.socket)
            print(f"nvtrain warm start: off, workers start cold: {unsafe}", file=sys.stderr)
            signal.pause()
            return
        Server(args.socket, listener).serve()
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(args.socket)


if __name__ == "__main__":
    main()

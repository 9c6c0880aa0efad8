"""The worker's entrypoint under ``nvtrain run``: ``python -m nvtrain.entry [-m MODULE | SCRIPT] ARGS``.

Runs the script as ``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) would, and ends the
process the way the interpreter ends it up to the point where torch can abort it: the
non-daemon threads are waited for, the ``atexit`` handlers run, files the script left open are
flushed, and then the process exits with the script's code, without the interpreter's
finalization. That finalization tears down objects that native threads still use (gloo's, after
``destroy_process_group`` too): a rank that finished its run can die of SIGABRT there
("terminate called without an active exception"), and ft_launcher then restarts the whole
group for a run that was over. Objects' ``__del__`` methods that only finalization would call do
not run. The warm-start worker (``nvtrain.zygote``) ends the same way, and so can any program
whose ``main()`` goes through ``call``. Imports the standard library only.

ft_launcher runs with a private ``$TMPDIR`` inside the run's state folder (its IPC sockets, torch
elastic's logs); the script gets the ``$TMPDIR`` of ``nvtrain run`` back (``restore_tmpdir``), in
a cold worker and in a warm one alike (both go through ``run``).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import itertools
import os
import runpy
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import NoReturn

__all__ = [
    "USER_TMPDIR_ENV",
    "Exit",
    "Target",
    "call",
    "finish",
    "freeze",
    "main",
    "parse",
    "restore_tmpdir",
    "run",
]

USER_TMPDIR_ENV = "NVTRAIN_USER_TMPDIR"
"""``$TMPDIR`` as ``nvtrain run`` found it (empty: unset), for the script; ft_launcher's own
``$TMPDIR`` is a private folder of the run's."""


@dataclass(frozen=True)
class Target:
    """What the worker runs: a script path or a module name, and the argv it sees."""

    script: str | None
    module: str | None
    argv: list[str]


@dataclass(frozen=True)
class Exit:
    """How the worker ends: an exit code (0-255), or a signal to die of (``signal`` > 0)."""

    code: int = 0
    signal: int = 0


def parse(argv: list[str], prog: str = "python -m nvtrain.entry") -> Target:
    """The target from ``[-m MODULE | SCRIPT] ARGS``."""
    if len(argv) >= 2 and argv[0] == "-m":
        return Target(None, argv[1], [argv[1], *argv[2:]])
    if not argv or argv[0].startswith("-"):
        raise SystemExit(f"usage: {prog} [-m MODULE | SCRIPT] [ARGS...]")
    return Target(argv[0], None, list(argv))


def _own_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without the frames of this module and runpy above the script's first."""
    skipped = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
    while tb is not None and tb.tb_frame.f_code.co_filename in skipped:
        tb = tb.tb_next
    return tb


def restore_tmpdir() -> None:
    """Give the script the user's ``$TMPDIR`` (``USER_TMPDIR_ENV``, removed) in place of
    ft_launcher's private one, and forget a temporary folder ``tempfile`` found from the latter
    (a warm worker's server may have asked already). Nothing without ``USER_TMPDIR_ENV``."""
    user = os.environ.pop(USER_TMPDIR_ENV, None)
    if user is None:
        return
    launchers = os.environ.pop("TMPDIR", "")
    if user:
        os.environ["TMPDIR"] = user
    if launchers and "tempfile" in sys.modules:  # not imported yet: nothing remembered
        import tempfile

        if tempfile.tempdir == os.path.abspath(launchers):
            tempfile.tempdir = None


def run(target: Target, *, own_path: bool = True) -> Exit:
    """Run the target as ``__main__``; returns how the process should end (``call``).
    ``own_path``: ``sys.path[0]`` becomes the script's folder, as for ``python SCRIPT`` (the
    module form keeps the working directory there); otherwise the folder is put in front of the
    path. The script sees the user's ``$TMPDIR`` (``restore_tmpdir``)."""
    restore_tmpdir()
    _Written.hook()
    sys.argv = list(target.argv)

    def body() -> None:
        if target.module is not None:
            if not own_path:
                sys.path.insert(0, os.getcwd())
            _SCRIPT_GLOBALS.append(runpy.run_module(target.module, run_name="__main__", alter_sys=True))
        else:
            assert target.script is not None
            folder = os.path.dirname(os.path.abspath(target.script))
            if own_path and sys.path:
                sys.path[0] = folder
            else:
                sys.path.insert(0, folder)
            _SCRIPT_GLOBALS.append(runpy.run_path(target.script, run_name="__main__"))

    return call(body)


_SCRIPT_GLOBALS: list[dict[str, object]] = []
"""The script's globals once it has run, kept to the process's end as ``python SCRIPT`` keeps
``__main__``'s: dropped when ``runpy`` returned, they freed the script's objects while its
``atexit`` handlers were still to run, and a DDP model freed so could deadlock: the
``Reducer``'s gloo process group joins its worker thread with the GIL held while that thread
waits for the GIL to free a finished collective (seen in 1 run of 3 of a plain DDP script
forked warm, under load)."""


def call(main: Callable[[], object]) -> Exit:
    """Call ``main()`` as a program's body; returns how its process should end, as the
    interpreter would end it: its exit code (``SystemExit``; a message is printed, exit 1), or
    SIGINT after an uncaught KeyboardInterrupt. Any other uncaught exception is printed through
    ``sys.excepthook`` (exit 1). ``finish`` then ends the process so. A program that is not a
    script (ft_launcher's ``main()``) ends through it too."""
    try:
        main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return Exit(int(exc.code or 0) & 0xFF)
        sys.stderr.write(f"{exc.code}\n")
        return Exit(1)
    except BaseException as exc:  # noqa: BLE001 - as the interpreter does: print it
        exc = exc.with_traceback(_own_frames(exc.__traceback__))
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return Exit(130, signal.SIGINT) if isinstance(exc, KeyboardInterrupt) else Exit(1)
    return Exit(0)


class _Written:
    """What the process's ending must know of the files the script opened (an audit hook, added
    once per process by ``run``): ``opened`` turns True at the first file object opened for
    writing (``open``, ``Path.open``, ``os.fdopen``; not ``os.open``'s raw descriptors), and
    ``frozen`` when one was open before ``freeze``. Nothing but a flag per event: the hook sees
    every audited event of the process."""

    hooked = False
    opened = False
    frozen = False

    @classmethod
    def hook(cls) -> None:
        if not cls.hooked:
            cls.hooked = True
            sys.addaudithook(cls._note)

    @classmethod
    def _note(cls, event: str, args: tuple[object, ...]) -> None:
        if cls.opened or event != "open" or len(args) != 3 or not isinstance(args[1], str):
            return  # args: (path or fd, mode, flags); a raw os.open has no mode
        flags = args[2]
        if isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR):
            cls.opened = True


def freeze() -> None:
    """``gc.freeze()``, noting whether a file the script opened for writing may be among the
    frozen objects: ``gc.get_objects`` does not list frozen objects, and ``finish`` then looks
    at them too, to flush such a file. (Looking at every frozen object costs 0.1-0.3 s in a
    worker forked by the warm-start server, each object touched a page copied: it is done only
    then.) The worker library freezes what exists when training starts through this."""
    _Written.frozen |= _Written.opened
    gc.freeze()


def _open_files() -> list[io.TextIOWrapper | io.BufferedIOBase]:
    """The file objects that exist, text layers first, then the buffers beneath: every object
    the garbage collector tracks, and those that ``freeze`` froze when a file opened for writing
    may be among them."""
    gc.disable()  # no collection from here on: the process is ending
    if _Written.frozen:
        gc.unfreeze()  # (not gc.get_freeze_count(): it walks every frozen object)
    objects = gc.get_objects()
    # By type(obj), not isinstance(obj): isinstance asks an object that is not a file for its
    # __class__, and some objects warn when asked (torch's deprecated ``reduce_op``). The few
    # distinct types are judged first, then the objects are picked out by type in C: a test in
    # Python per object takes twice as long (0.1 s with torch imported).
    wanted = (io.TextIOWrapper, io.BufferedIOBase)
    try:
        kinds = {kind for kind in set(map(type, objects)) if issubclass(kind, wanted)}
        files = list(itertools.compress(objects, map(kinds.__contains__, map(type, objects))))
    except TypeError:  # a metaclass that made its classes unhashable
        files = [obj for obj in objects if issubclass(type(obj), wanted)]
    files.sort(key=lambda f: not issubclass(type(f), io.TextIOWrapper))
    return files


def _flush_open_files() -> None:
    """Flush the writable files still open (the interpreter's finalization would flush them as
    it frees them)."""
    files = _open_files()
    for f in files:
        with contextlib.suppress(Exception):
            # The standard streams are flushed last, through sys.stdout and sys.stderr (in a
            # forked worker, fds 0-2 are no longer the ones the server's own objects wrote to).
            if not f.closed and f.writable() and f.fileno() > 2:
                f.flush()


def finish(end: Exit) -> NoReturn:
    """End the process as the interpreter would, without its finalization (module docstring)."""
    try:
        shutdown = getattr(threading, "_shutdown", None)  # what the interpreter calls first
        if shutdown is not None:
            with contextlib.suppress(BaseException):
                shutdown()
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            _flush_open_files()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        if end.signal > 0:
            with contextlib.suppress(BaseException):
                signal.signal(end.signal, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {end.signal})
                os.kill(os.getpid(), end.signal)
        os._exit(end.code)


def main(argv: list[str] | None = None) -> NoReturn:
    finish(run(parse(list(sys.argv[1:] if argv is None else argv))))


if __name__ == "__main__":
    # Through the module the script imports, not this ``__main__`` copy of it: ``freeze`` then
    # reads the flags that ``run``'s hook sets.
    from nvtrain import entry

    entry.main()

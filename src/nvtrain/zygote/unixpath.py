"""Unix socket paths of any length.

A Unix socket's address holds at most 107 bytes of path, and the warm-start server's socket lies
in the run's state folder, under ``$TMPDIR`` and a folder named for the run id: a deep
``$TMPDIR`` or a long job name exceeds that (``AF_UNIX path too long``), and the workers started
cold. ``reachable`` names such a path through a descriptor of its folder
(``/proc/self/fd/N/NAME``), which the kernel resolves as it would the whole path: the socket is
the same file, with the same owner, mode and folder checks. Linux only, as the rest of nvtrain.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

__all__ = ["MAX_PATH", "reachable"]

MAX_PATH = 107
"""Bytes of path a Unix socket address holds (108 with the terminating NUL)."""


@contextlib.contextmanager
def reachable(path: str) -> Iterator[str]:
    """``path`` itself when it fits a socket address; otherwise the same file named through an
    open descriptor of its folder, valid inside the ``with`` block (bind or connect there)."""
    if len(os.fsencode(path)) <= MAX_PATH:
        yield path
        return
    folder, name = os.path.split(path)
    fd = os.open(folder or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        short = f"/proc/self/fd/{fd}/{name}"
        if len(os.fsencode(short)) > MAX_PATH:
            raise OSError(errno.ENAMETOOLONG, "socket name too long", name)
        yield short
    finally:
        os.close(fd)

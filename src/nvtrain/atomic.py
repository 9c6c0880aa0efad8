"""Writing a whole file at once: a new file next to it, renamed over it.

Readers (and a write that fails half-way: a full disk, an error while rendering) see the old
file or the new one, never part of either.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

__all__ = ["write_atomically"]


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``: into a new file in its folder (created with the usual mode, or
    the mode of the file it replaces), flushed to disk, then renamed over ``path``. ``OSError``
    when it cannot be done; the new file is then removed and ``path`` is as it was."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a process of the same pid that was killed while writing
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

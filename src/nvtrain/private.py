"""Folders and files that only this user can have made or entered.

Every folder, file and socket that nvtrain makes for a run on a host that other users may share
(``$TMPDIR``, ``/dev/shm``, a checkpoint volume) goes through here: a new folder is made with
``mkdir`` at mode 0700 (which fails if anything is there already), and one that exists is used
only when ``lstat`` says it is a real folder (not a link), owned by this process's user, and
closed to group and others. A private file is made with ``O_CREAT | O_EXCL | O_NOFOLLOW`` at
mode 0600 and read back only after ``fstat`` on the open descriptor says the same. Standard
library only: the launcher, the warm-start server and the worker library all use it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

__all__ = [
    "RUN_KEY_ENV",
    "NotPrivate",
    "check_private_dir",
    "open_parent",
    "make_private_dir",
    "read_private_file",
    "run_key",
    "write_private_file",
    "write_run_key",
]

RUN_KEY_ENV = "NVTRAIN_RUN_KEY_FILE"
"""The workers' variable naming the run's secret: a private file (0600, this user's) that
``nvtrain run`` writes into its private state folder. Host and peer copies are authenticated
with it; a process without it cannot make a copy that a worker of this run accepts."""
RUN_KEY_BYTES = 32


class NotPrivate(OSError):
    """A path that is not this user's alone: ``path`` and ``reason`` say what is wrong (the
    caller turns it into a message with the key or variable that named the path)."""

    def __init__(self, path: Path, reason: str, *, parent: bool = False) -> None:
        self.path = path
        self.reason = reason
        self.parent = parent
        """The fault is the folder that holds ``path`` (``open_parent``), not ``path``."""
        super().__init__(f"{path}: {reason}")


def _owner_text(uid: int) -> str:
    with contextlib.suppress(ImportError, KeyError):
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    return f"uid {uid}"


def _problem(info: os.stat_result, *, folder: bool, closed: int) -> str | None:
    """Why ``info`` does not describe a private folder (or file); None when it does."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if folder and not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if not folder and not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != os.geteuid():
        return f"belongs to {_owner_text(info.st_uid)}, not to this process's {_owner_text(os.geteuid())}"
    mode = stat.S_IMODE(info.st_mode)
    if mode & closed:
        return f"has mode {mode:04o}: group or others may {'enter or change' if folder else 'read'} it"
    return None


def check_private_dir(path: Path, *, closed: int = 0o077) -> str | None:
    """Why ``path`` is not a private folder of this user (``lstat``: a link, not a folder,
    another owner, a mode that opens any bit of ``closed``), or None when it is one. A path
    that does not exist is "does not exist"."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be looked at: {exc.strerror or exc}"
    return _problem(info, folder=True, closed=closed)


def open_parent(path: Path) -> str | None:
    """Why another user could take ``path`` away from us through its parent folder (one that
    anyone may write without the sticky bit lets anyone rename or remove what is in it, and put
    their own folder in its place), or None. ``/tmp`` and ``/dev/shm`` (sticky) pass; so does a
    group-writable volume root (Kubernetes' ``fsGroup``): the group is the pod's."""
    parent = path.parent
    try:
        info = os.stat(parent)
    except OSError:
        return None  # nothing there yet: the caller's own mkdir or open reports it
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        return (
            f"is in {parent} (mode {stat.S_IMODE(info.st_mode):04o}), which anyone may write without "
            "the sticky bit: another user could rename it away and put their own in its place"
        )
    return None


def make_private_dir(path: Path, *, exist_ok: bool = True, closed: int = 0o077) -> bool:
    """Make ``path`` (its parent must exist) at mode 0700, whatever the umask; returns True when
    it was made here. If something is there already it is accepted only when ``exist_ok`` and
    it passes ``check_private_dir``; else ``NotPrivate`` (also when its parent lets anyone
    replace it: ``open_parent``, ``NotPrivate.parent``). Other ``OSError``s (no room, no
    permission on the parent) are raised as they are."""
    problem = open_parent(path)
    if problem is not None:
        raise NotPrivate(path, problem, parent=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        problem = "exists already" if not exist_ok else check_private_dir(path, closed=closed)
        if problem is not None:
            raise NotPrivate(path, problem) from None
        return False
    # mkdir's mode is masked by the umask; a umask can only take bits away, never add group or
    # other bits, but a umask that takes the owner's bits would leave a folder we cannot use.
    os.chmod(path, 0o700, follow_symlinks=False)
    problem = check_private_dir(path, closed=closed)
    if problem is not None:  # replaced between mkdir and lstat: someone else is in the parent
        raise NotPrivate(path, problem)
    return True


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file ``path`` at mode 0600 (fails if anything is there, a link
    included: ``FileExistsError``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def read_private_file(path: Path, *, limit: int = 1 << 20) -> bytes:
    """The contents of ``path`` (at most ``limit`` bytes), when it is a regular file of this
    user's that group and others cannot read or change, and not a link; else ``NotPrivate``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if os.path.islink(path):
            raise NotPrivate(path, "is a symbolic link") from None
        raise exc
    try:
        problem = _problem(os.fstat(fd), folder=False, closed=0o077)
        if problem is not None:
            raise NotPrivate(path, problem)
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotPrivate(path, f"is larger than {limit} bytes")
    return data


def write_run_key(path: Path) -> bytes:
    """Make a new random secret for this run in the new private file ``path``; returns it."""
    import secrets

    key = secrets.token_bytes(RUN_KEY_BYTES)
    write_private_file(path, key)
    return key


def run_key(environ: dict[str, str] | None = None) -> bytes | None:
    """The run's secret from the file ``$NVTRAIN_RUN_KEY_FILE`` names; None when the variable
    is unset or empty (a worker started without ``nvtrain run``). A file that is not private or
    holds no key of the right size is ``NotPrivate``."""
    env = os.environ if environ is None else environ
    name = env.get(RUN_KEY_ENV, "")
    if not name:
        return None
    path = Path(name)
    key = read_private_file(path, limit=RUN_KEY_BYTES)
    if len(key) != RUN_KEY_BYTES:
        raise NotPrivate(path, f"holds {len(key)} bytes, not a {RUN_KEY_BYTES}-byte run key")
    return key

"""Folders and files that only this user can have made or entered.

Every folder, file and socket that nvtrain makes for a run on a host that other users may share
(``$TMPDIR``, ``/dev/shm``, a checkpoint volume) goes through here: a new folder is made with
``mkdir`` at mode 0700 (which fails if anything is there already), and one that exists is used
only when ``lstat`` says it is a real folder (not a link), owned by this process's user, and
closed to group and others. Every folder above it, from ``/`` down, must be safe too
(``unsafe_ancestor``: root's or this user's, and not writable by others unless sticky), so that
no other user can rename a folder on the way away and put their own in its place. A private
file is made with ``O_CREAT | O_EXCL | O_NOFOLLOW`` at mode 0600 and read back only after
``fstat`` on the open descriptor says the same; a file that is appended to all run long (the
events log) is opened relative to a descriptor of its folder (``open_folder``, ``open_append``).
Standard library only: the launcher, the warm-start server and the worker library all use it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

__all__ = [
    "RUN_KEY_ENV",
    "NotPrivate",
    "check_private_dir",
    "claim_default",
    "make_private_dir",
    "open_append",
    "open_folder",
    "open_parent",
    "read_private_file",
    "run_key",
    "unsafe_ancestor",
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

    def __init__(self, path: Path, reason: str, *, parent: bool = False, fix: str = "") -> None:
        self.path = path
        self.reason = reason
        self.parent = parent
        """The fault is a folder above ``path`` (``unsafe_ancestor``), not ``path``."""
        self.fix = fix
        """What to change on that folder (``parent`` only): "give /x the sticky bit ..."."""
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
    """Why another user could take ``path`` away from us through a folder above it
    (``unsafe_ancestor``), or None."""
    found = unsafe_ancestor(path.parent, below=path)
    return None if found is None else found.reason


_MAX_LINKS = 40
"""Symbolic links followed on one path before it counts as a loop (as the kernel's limit)."""


def _safe_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def unsafe_ancestor(folder: Path, *, below: Path | None = None) -> NotPrivate | None:
    """Why another user could swap ``folder`` or a folder above it for their own, as a
    ``NotPrivate`` for ``below`` (default: ``folder``) with ``parent`` set, naming the folder at
    fault, its owner and mode, and the fix; None when every folder from ``/`` down to ``folder``
    is root's or this user's and not writable by others unless sticky (``/tmp``, ``/dev/shm``).
    A group-writable folder passes (a Kubernetes volume with ``fsGroup``: the group is the
    pod's). Checked one name at a time with ``lstat``; a symbolic link is followed only when it
    is root's or this user's (or lies in a folder others cannot write), and the folders of its
    target are checked the same way. The part that does not exist yet ends the check: whoever
    makes it makes it in a safe folder (and checks again after)."""
    target = below if below is not None else folder
    raw = os.fspath(folder)
    pending = [part for part in (raw if raw.startswith("/") else f"{os.getcwd()}/{raw}").split("/") if part]
    pending.reverse()  # the next name last
    current, info, links = Path("/"), os.lstat("/"), 0
    while True:
        problem = _unsafe_folder(current, info, target, under=bool(pending) or target != folder)
        if problem is not None or not pending:
            return problem
        name = pending.pop()
        if name in (".", ".."):
            current = current.parent if name == ".." else current
            info = os.lstat(current)
            continue
        candidate = current / name
        try:
            entry = os.lstat(candidate)
        except OSError:
            return None  # missing (or not for us to look at): the caller's mkdir or open says so
        if stat.S_ISLNK(entry.st_mode):
            links += 1
            problem = _unsafe_link(candidate, entry, info, target, links)
            if problem is not None:
                return problem
            link = os.readlink(candidate)
            pending.extend(reversed([part for part in link.split("/") if part]))
            if link.startswith("/"):
                current, info = Path("/"), os.lstat("/")
            continue
        if not stat.S_ISDIR(entry.st_mode):
            return None  # not a folder: the caller's mkdir or open fails with its own error
        current, info = candidate, entry


def _unsafe_link(
    link: Path, entry: os.stat_result, holder: os.stat_result, target: Path, links: int
) -> NotPrivate | None:
    """A symbolic link on the way to ``target`` (in a folder described by ``holder``)."""
    if links > _MAX_LINKS:
        return NotPrivate(target, f"is reached through too many symbolic links ({link})")
    if _safe_owner(entry.st_uid) or not holder.st_mode & (stat.S_IWOTH | stat.S_IWGRP):
        return None
    return NotPrivate(
        target,
        f"is reached through {link}, a symbolic link that belongs to {_owner_text(entry.st_uid)}, in "
        "a folder others may write: that user could point it elsewhere",
        parent=True,
        fix=f"use a path without the link {link}",
    )


def _unsafe_folder(folder: Path, info: os.stat_result, target: Path, *, under: bool) -> NotPrivate | None:
    """``folder`` (on the way to ``target``) described by ``info``: why it is not safe, or None."""
    mode = stat.S_IMODE(info.st_mode)
    place = f"is {'in' if folder == target.parent else 'under'} {folder}" if under else "is a folder"
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        owner = "" if _safe_owner(info.st_uid) else f" (and which belongs to {_owner_text(info.st_uid)})"
        return NotPrivate(
            target,
            f"{place} (mode {mode:04o}), which anyone may write without the sticky bit{owner}: "
            "another user could rename it away and put their own in its place",
            parent=True,
            fix=f"give {folder} the sticky bit (chmod +t) or take others' write (chmod o-w)",
        )
    if not _safe_owner(info.st_uid):
        return NotPrivate(
            target,
            f"{place} (mode {mode:04o}), which belongs to {_owner_text(info.st_uid)}: that user "
            "could rename what is in it away and put their own in its place",
            parent=True,
            fix=f"make {folder} root's or this user's (chown), or remove it if no one uses it",
        )
    return None


def claim_default(top: Path, rest: str = "") -> tuple[Path, str | None]:
    """A default folder of nvtrain's in a place every user shares (``$TMPDIR/nvtrain``, the
    demo's ``/tmp/nvtrain-demo``): ``top / rest`` when ``top`` is not there yet or is this
    user's; when another user has it (made first, or a link), a fresh name of this user's beside
    it (``<top>-<uid>-<random>``, which nobody can guess; the one an earlier run took, when there
    is one: ``_earlier_claim``) and one line saying so. Nothing is made here; a ``top`` in an
    unsafe place is left for the start to refuse."""
    try:
        info = os.lstat(top)
    except FileNotFoundError:
        return top / rest if rest else top, None
    except OSError:
        return top / rest if rest else top, None
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
        return top / rest if rest else top, None
    what = "is a symbolic link" if stat.S_ISLNK(info.st_mode) else f"belongs to {_owner_text(info.st_uid)}"
    if not stat.S_ISLNK(info.st_mode) and not stat.S_ISDIR(info.st_mode):
        what = "is not a folder"
    earlier = _earlier_claim(top)
    fresh = earlier or top.with_name(f"{top.name}-{os.geteuid()}-{secrets.token_hex(6)}")
    chosen = fresh / rest if rest else fresh
    note = (
        f"{top} {what}; this run keeps its checkpoints in {'the' if earlier else 'a fresh'} folder of "
        f"this user's, {chosen} (set [checkpoint] dir to choose the folder)"
    )
    return chosen, note


def _earlier_claim(top: Path) -> Path | None:
    """The first (by name) folder ``<top>-<uid>-<random>`` beside ``top`` that an earlier run of
    this user's took (a real folder of this user's that group and others cannot write), so that
    a run started again with the same id finds its checkpoints; None when there is none."""
    prefix = f"{top.name}-{os.geteuid()}-"
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(top.parent)):
            rest = name[len(prefix) :]
            if name.startswith(prefix) and len(rest) == 12 and all(c in "0123456789abcdef" for c in rest):
                if check_private_dir(top.parent / name, closed=0o022) is None:
                    return top.parent / name
    return None


def make_private_dir(path: Path, *, exist_ok: bool = True, closed: int = 0o077) -> bool:
    """Make ``path`` (its parent must exist) at mode 0700, whatever the umask; returns True when
    it was made here. If something is there already it is accepted only when ``exist_ok`` and
    it passes ``check_private_dir``; else ``NotPrivate`` (also when a folder above it lets
    another user replace it: ``unsafe_ancestor``, ``NotPrivate.parent``). Other ``OSError``s (no
    room, no permission on the parent) are raised as they are."""
    unsafe = unsafe_ancestor(path.parent, below=path)
    if unsafe is not None:
        raise unsafe
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


def open_folder(path: Path) -> int:
    """A descriptor (``O_DIRECTORY``) of the folder ``path``, when it is this user's and every
    folder above it is safe (``unsafe_ancestor``); else ``NotPrivate``. Files opened relative to
    it (``open_append``) stay in that folder even if it is renamed away later."""
    unsafe = unsafe_ancestor(path)
    if unsafe is not None:
        raise unsafe
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        os.close(fd)
        raise NotPrivate(
            path, f"belongs to {_owner_text(info.st_uid)}, not to this process's {_owner_text(os.geteuid())}"
        )
    return fd


def open_append(folder_fd: int, name: str, where: Path) -> int:
    """Open (or make, at 0644) the file ``name`` in the folder of ``folder_fd`` to append to it:
    never through a link (``O_NOFOLLOW``), and only when ``fstat`` says it is a regular file of
    this user's; else ``NotPrivate`` for ``where`` (the file's path, for the message)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(name, flags, 0o644, dir_fd=folder_fd)
    except OSError as exc:
        link = False
        with contextlib.suppress(OSError):
            link = stat.S_ISLNK(os.lstat(name, dir_fd=folder_fd).st_mode)
        if link:
            raise NotPrivate(where, "is a symbolic link: not followed, nothing written") from None
        raise exc
    info = os.fstat(fd)
    problem = _problem(info, folder=False, closed=0)
    if problem is None and info.st_mode & 0o022:
        problem = f"has mode {stat.S_IMODE(info.st_mode):04o}: group or others may change it"
    if problem is not None:
        os.close(fd)
        raise NotPrivate(where, f"{problem}: nothing written")
    return fd

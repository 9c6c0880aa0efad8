"""Why ``tune-interval --apply`` cannot write a policy file, told apart: a read-only mount
(``EROFS``: no mode or owner would help; the fix is a writable copy or a read-write mount), a
file made read-only (its mode), or no permission to write its folder (``EACCES``, ``EPERM``:
the file is replaced by a new one renamed over it, which needs the folder's write permission)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from nvtrain.errors import UsageError

__all__ = ["check_writable", "write_error"]

_MOUNTINFO = Path("/proc/self/mountinfo")


def _read_only_mount(path: Path) -> str | None:
    """The mount point of the read-only file system ``path`` is on (``"/"`` and the like), or
    ``"?"`` when it is read-only but its mount point is not known; None when it is writable."""
    try:
        if not os.statvfs(path).f_flag & os.ST_RDONLY:
            return None
    except OSError:
        return None
    return _mount_point(path) or "?"


def _mount_point(path: Path) -> str | None:
    """The longest mount point of ``/proc/self/mountinfo`` that holds ``path`` (bind mounts
    included, which a walk up the folders by device number would miss)."""
    try:
        lines = _MOUNTINFO.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    real = str(path.resolve())
    best: str | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        # Spaces, tabs, newlines and backslashes in a mount point are written as octal escapes.
        point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
        point = point.replace("\\134", "\\")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best)):
            best = point
    return best


def _read_only_error(path: Path, mount: str) -> UsageError:
    where = "a read-only file system" if mount == "?" else f"a file system mounted read-only at {mount}"
    remount = (
        "remount it read-write"
        if mount == "?"
        else f"remount {mount} read-write (mount -o remount,rw {mount})"
    )
    return UsageError(
        f"--apply: {path} is on {where}, so its interval is left as it is (no file mode or owner "
        "can make it writable)",
        f"apply the interval to a writable copy (cp {path} policy.toml; then --apply policy.toml) "
        f"or to the file the mount is made from, {remount}, or leave out --apply",
    )


def check_writable(path: Path, target: Path) -> None:
    """``UsageError`` when the policy file ``target`` (``path`` as given) cannot be replaced:
    it or its folder is on a read-only mount, or the file itself is read-only. It is replaced
    by a rename, which needs only its folder to be writable: a file made read-only would be
    rewritten anyway, so its mode is checked here."""
    for where in (target, target.parent):
        mount = _read_only_mount(where)
        if mount is not None:
            raise _read_only_error(path, mount)
    mode = target.stat().st_mode
    if not os.access(target, os.W_OK) or not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise UsageError(
            f"--apply: {path} is read-only (mode {stat.filemode(mode)}), so its interval is left as it is",
            f"make it writable (chmod u+w {path}) to apply the interval, or leave out --apply",
        )


def write_error(path: Path, target: Path, exc: OSError) -> UsageError:
    """The ``UsageError`` for ``exc``, raised while the new policy file was written next to
    ``target`` and renamed over it."""
    if exc.errno == errno.EROFS:
        return _read_only_error(path, _mount_point(target.parent) or "?")
    if exc.errno in (errno.EACCES, errno.EPERM):
        folder = target.parent
        return UsageError(
            f"--apply: cannot write {path}: no permission to write in {folder} ({exc.strerror}), "
            "where a new file is written and renamed over the policy; its interval is left as it is",
            f"give this user write permission on the folder (chmod u+w {folder}, or run as its "
            "owner), apply the interval by hand, or leave out --apply",
        )
    return UsageError(
        f"--apply: cannot write {target} ({exc.strerror or exc})",
        "make the file and its directory writable, or apply the interval by hand",
    )

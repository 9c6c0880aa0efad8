"""Free ranks blocked in a gloo collective when an in-process restart begins.

A gloo collective cannot be aborted: ``ProcessGroupGloo.abort()`` and ``shutdown()`` leave its
TCP connections open (torch 2.13), and NVRx's abort handles NCCL only. A rank blocked in one
therefore waits until the collective times out (``[job] collective_timeout``) or until a peer's
connection closes, which is what frees it when a peer process dies.

This module closes the connections on purpose. Around ``init_process_group`` it notes the
sockets the call opened (the process group's connections to its peers, and its listening
socket); when an in-process restart begins, ``cut`` shuts the connected ones down
(``shutdown(SHUT_RDWR)``: the descriptors stay gloo's, only the connections end). The blocked
collective on this rank fails at once ("Connection closed by peer"), and so does any peer's
collective that waits on this rank: the rank that raised cuts first, each freed rank cuts in
turn, and the whole group is free in milliseconds instead of ``collective_timeout``.

Only TCP connections opened while that one call ran are touched, each checked again before the
cut (still a socket, same inode). Other threads may open sockets meanwhile: on the rank that
hosts a c10d store, its server accepts the connections of other processes' clients at any time,
and cutting one of those stalls the restart itself (NVRx's monitors record interruptions in that
store). So connections to or from the stores' ports (``exclude_ports``) are never noted, nor Unix
sockets or listeners. The training script's own connections, NVRx's and groups the script makes
later keep running. Collectives on groups the script creates itself (``new_group``) are not cut
and keep their timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import stat
from collections.abc import Collection, Iterator

__all__ = ["GlooLinks", "open_sockets"]

_INET = (socket.AF_INET, socket.AF_INET6)

_FD_DIR = "/proc/self/fd"


def _a_connection(fd: int, exclude_ports: set[int]) -> bool:
    """Whether ``fd`` is a TCP connection (not a listener) with neither end on ``exclude_ports``."""
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        with socket.socket(fileno=dup) as sock:
            if sock.family not in _INET or sock.type != socket.SOCK_STREAM:
                return False
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                return False
            ends = (sock.getsockname(), sock.getpeername())
    except OSError:  # not connected (any more), or not a socket
        return False
    return not any(end[1] in exclude_ports for end in ends)


def open_sockets() -> dict[int, int]:
    """This process's open sockets: ``{descriptor: inode}``."""
    found: dict[int, int] = {}
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return found
    for name in names:
        with contextlib.suppress(ValueError, OSError):
            fd = int(name)
            info = os.fstat(fd)
            if stat.S_ISSOCK(info.st_mode):
                found[fd] = info.st_ino
    return found


@dataclasses.dataclass
class GlooLinks:
    """The sockets one process-group creation opened, to be cut when a restart begins."""

    sockets: dict[int, int] = dataclasses.field(default_factory=dict)
    cut_count: int = 0

    @classmethod
    @contextlib.contextmanager
    def noting(cls, enabled: bool = True, exclude_ports: Collection[int] = ()) -> Iterator[GlooLinks]:
        """``with GlooLinks.noting() as links: dist.init_process_group(...)``: ``links`` holds
        the TCP connections the block opened (none when ``enabled`` is false), but none whose
        either end is one of ``exclude_ports`` (the stores')."""
        links = cls()
        before = open_sockets() if enabled else {}
        try:
            yield links
        finally:
            if enabled:
                after = open_sockets()
                new = {fd: ino for fd, ino in after.items() if before.get(fd) != ino}
                links.sockets = {fd: ino for fd, ino in new.items() if _a_connection(fd, set(exclude_ports))}

    def cut(self) -> int:
        """Shut down the noted connections that are still open; returns how many. Safe to call
        from any thread and more than once; never raises."""
        count = 0
        for fd, inode in list(self.sockets.items()):
            try:
                info = os.fstat(fd)
            except OSError:
                self.sockets.pop(fd, None)
                continue
            if not stat.S_ISSOCK(info.st_mode) or info.st_ino != inode:
                self.sockets.pop(fd, None)  # closed, and the number taken by something else
                continue
            try:
                dup = os.dup(fd)
            except OSError:
                continue
            try:
                with socket.socket(fileno=dup) as sock:
                    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                        continue  # gloo's listener: shutting it down aborts the process
                    if sock.type != socket.SOCK_STREAM:
                        continue
                    sock.shutdown(socket.SHUT_RDWR)
                    count += 1
            except OSError:
                continue
        self.cut_count += count
        return count

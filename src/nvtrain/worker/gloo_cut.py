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

Only sockets opened by that one call are touched, each checked again before the cut (still a
socket, same inode, not listening): the training script's own connections, the rendezvous
store's, NVRx's and groups the script makes later keep running. Collectives on groups the script
creates itself (``new_group``) are not cut and keep their timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import stat
from collections.abc import Iterator

__all__ = ["GlooLinks", "open_sockets"]

_FD_DIR = "/proc/self/fd"


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
    def noting(cls, enabled: bool = True) -> Iterator[GlooLinks]:
        """``with GlooLinks.noting() as links: dist.init_process_group(...)``: ``links`` holds
        the sockets the block opened (none when ``enabled`` is false)."""
        links = cls()
        before = open_sockets() if enabled else {}
        try:
            yield links
        finally:
            if enabled:
                after = open_sockets()
                links.sockets = {fd: ino for fd, ino in after.items() if before.get(fd) != ino}

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

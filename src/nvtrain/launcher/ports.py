"""Is the rendezvous port free? Checked on the node that hosts the store, before ft_launcher starts.

ft_launcher's c10d store listens on every address of the node (``::``, or ``0.0.0.0`` without
IPv6) with ``SO_REUSEADDR``. A port that another process listens on makes the store fail inside
ft_launcher, which ends as a spent restart budget (exit 1, retried by Kubernetes); found here, it
is a usage error (exit 2) that names the key. The probe binds the way the store does, with
``SO_REUSEADDR``, so connections of an earlier run still in TIME_WAIT do not count as busy.
"""

from __future__ import annotations

import errno
import socket

from nvtrain.errors import UsageError

__all__ = ["check_rendezvous_port"]

_ADDRESSES = ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0"))
"""Where the store listens: IPv6 (dual-stack) first, IPv4 where IPv6 is not available."""


def check_rendezvous_port(port: int) -> None:
    """``UsageError`` when the store could not listen on ``port`` here: another process holds
    it (or, below 1024, this user may not bind it). Other failures are left to ft_launcher."""
    for family, host in _ADDRESSES:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this node
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                sock.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise UsageError(
                        f"[rendezvous] port = {port} is in use on this node: the rendezvous store "
                        "cannot listen on it (another run, or another program, holds it)",
                        f"stop what listens on port {port}, or set another free port in [rendezvous] port",
                    ) from None
                if exc.errno == errno.EACCES:
                    raise UsageError(
                        f"[rendezvous] port = {port} cannot be bound by this user (ports below "
                        "1024 need privileges): the rendezvous store cannot listen on it",
                        "set [rendezvous] port to 1024 or above, e.g. port = 29500",
                    ) from None
                continue  # e.g. IPv6 present but not configured: the store falls back to IPv4
            return

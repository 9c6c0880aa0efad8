"""Is the rendezvous port free? Checked on the node that hosts the store, before ft_launcher starts.
And which port may a one-node job use when its policy names none (``free_port``)?

ft_launcher's c10d store listens on every address of the node (``::``, or ``0.0.0.0`` without
IPv6) with ``SO_REUSEADDR``. A port that another process listens on makes the store fail inside
ft_launcher, which ends as a spent restart budget (exit 1, retried by Kubernetes); found here, it
is a usage error (exit 2) that names the key. The probe binds the way the store does, with
``SO_REUSEADDR``, so connections of an earlier run still in TIME_WAIT do not count as busy.

``free_port`` is what ``torchrun --standalone`` does: the kernel's pick for port 0, on the
addresses the store binds. The port is free when picked; the store binds it a few seconds later,
when ft_launcher has started. Another process may take it in between (a narrow race, as with
torchrun); ``nvtrain run`` passes the port to the plan at once to keep it narrow.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Container

from nvtrain.errors import UsageError

__all__ = ["check_rendezvous_port", "free_port"]

_ADDRESSES = ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0"))
"""Where the store listens: IPv6 (dual-stack) first, IPv4 where IPv6 is not available."""


def check_rendezvous_port(port: int, *, flag: str | None = None) -> None:
    """``UsageError`` when the store could not listen on ``port`` here: another process holds
    it (or, below 1024, this user may not bind it). Other failures are left to ft_launcher.
    ``flag``: the command-line flag that gave the port, as typed (``--master-port 29500``),
    named first in the message and the fix; None: the policy's key."""
    where = f"{flag}: " if flag else ""
    change = (
        f"pass another free port ({flag.split()[0]})"
        if flag
        else "set another free port in [rendezvous] port"
    )
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
                        f"{where}[rendezvous] port = {port} is in use on this node: the rendezvous "
                        "store cannot listen on it (another run, or another program, holds it)",
                        f"stop what listens on port {port}, or {change}",
                    ) from None
                if exc.errno == errno.EACCES:
                    raise UsageError(
                        f"{where}[rendezvous] port = {port} cannot be bound by this user (ports below "
                        "1024 need privileges): the rendezvous store cannot listen on it",
                        "set [rendezvous] port to 1024 or above, e.g. port = 29500",
                    ) from None
                continue  # e.g. IPv6 present but not configured: the store falls back to IPv4
            return


def free_port(avoid: Container[int] = ()) -> int:
    """A port no process binds now on any address of this node (not one in ``avoid``): the
    kernel's pick for port 0, bound without ``SO_REUSEADDR`` (with it, Linux may hand out a port
    that another socket with ``SO_REUSEADDR`` holds) on every address, as the store listens."""
    port = _pick()
    while port in avoid:  # e.g. the metrics port, itself free until the run serves it
        port = _pick()
    return port


def _pick() -> int:
    for family, host in _ADDRESSES:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this node
            continue
        with sock:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                sock.bind((host, 0))
            except OSError:  # e.g. IPv6 present but not configured: the store falls back to IPv4
                continue
            return int(sock.getsockname()[1])
    raise UsageError(
        "cannot bind any TCP port on this node (neither IPv6 nor IPv4): the rendezvous store "
        "could not listen",
        "check the node's network configuration, or set [rendezvous] port",
    )

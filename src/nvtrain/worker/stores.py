"""The workers' own stores, hosted by rank 0: bound to ``MASTER_ADDR``'s address, with the
job's allow-list.

torch's ``TCPStore`` server binds every interface whatever host it is given. Rank 0 hosts two
stores of the workers: the process group's (``MASTER_PORT``: torch's ``env://`` store, or NVRx's
in-process ``Wrapper`` store under in-process restart) and nvtrain's in-process store
(``MASTER_PORT + 1``, the attempts' process groups). Here rank 0 binds each to the address
``MASTER_ADDR`` names (``nvtrain.storesocket``) and hands the socket to TCPStore
(``master_listen_fd``); the other ranks are its clients as before.

Who gets through: the hosts of ``$NVTRAIN_STORE_ALLOW`` (``[rendezvous] store_allow``), where
the launcher set it; in a job of one node (``GROUP_WORLD_SIZE=1``) this host only. Loopback
and the store's own address always pass. A name that is none of this node's addresses is
bound on every interface, and the worker says so.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from typing import Any

import torch.distributed as dist

from nvtrain.nvrx import inprocess_store
from nvtrain.nvrx.storeguard import ALLOW_ENV
from nvtrain.storesocket import allowed_networks, listening_socket
from nvtrain.worker import stopping
from nvtrain.worker.settings import say

__all__ = ["allow_list", "env_store", "guard_wrapper_store", "inprocess_base_store", "listening_fd"]


def allow_list() -> list[ipaddress.IPv4Network] | None:
    """Who may reach the workers' stores: ``$NVTRAIN_STORE_ALLOW``'s networks; ``[]`` (this host
    only) in a job of one node without one; None (no filter) otherwise. A bad list ends the
    worker with exit 2 and a line that names it."""
    text = os.environ.get(ALLOW_ENV, "").strip()
    if not text:
        return [] if os.environ.get("GROUP_WORLD_SIZE") == "1" else None
    try:
        return allowed_networks(text.split())
    except ValueError as exc:
        say(f"usage error: ${ALLOW_ENV} ([rendezvous] store_allow): {exc}; list addresses, CIDRs or names")
        stopping.exit_with(2)
        raise AssertionError("not reached") from None


def _wildcard(host: str) -> None:
    say(f"no address of MASTER_ADDR {host!r} is this node's: the workers' store listens on every interface")


def listening_fd(host: str, port: int) -> int:
    """A socket listening on ``host``'s address and ``port`` with the job's allow-list, as a file
    descriptor for ``TCPStore(master_listen_fd=...)`` (which owns it from then on). OSError as
    the bind raises it (the port in use)."""
    allow = allow_list()
    try:
        sock = listening_socket(host, port, allow, on_wildcard=_wildcard)
    except socket.gaierror:
        if allow != []:
            raise
        # One node, no list given: a MASTER_ADDR of IPv6 addresses only is bound unfiltered (the
        # filter admits IPv4 alone).
        sock = listening_socket(host, port, None, on_wildcard=_wildcard)
    return sock.detach()


def _tcp_store(host: str, port: int, *, hosts: bool, **kwargs: Any) -> Any:
    if hosts:
        try:
            fd = listening_fd(host, port)
        except OSError as exc:  # as torch's own bind fails (the port in use)
            raise RuntimeError(f"rank 0 cannot host the workers' store on {host}:{port}: {exc}") from exc
        return dist.TCPStore(host, port, is_master=True, master_listen_fd=fd, **kwargs)  # type: ignore[attr-defined]
    return dist.TCPStore(host, port, is_master=False, **kwargs)  # type: ignore[attr-defined]


def env_store(timeout: datetime.timedelta) -> Any | None:
    """The store ``init_process_group``'s ``env://`` would make (``MASTER_ADDR``,
    ``MASTER_PORT``, rank 0 hosting it, ``multi_tenant``), its server bound as the module says,
    under the ``default_pg`` prefix ``env://`` gives it. None where torch elastic's agent hosts
    the store (``TORCHELASTIC_USE_AGENT_STORE=True``) or the variables are missing: ``env://``
    as it is then."""
    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or any(n not in os.environ for n in names):
        return None
    store = _tcp_store(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        hosts=int(os.environ["RANK"]) == 0,
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
        multi_tenant=True,
        use_libuv=os.environ.get("USE_LIBUV", "1") == "1",
    )
    return dist.PrefixStore("default_pg", store)  # type: ignore[attr-defined]


def inprocess_base_store(world: int, *, hosts: bool, timeout: datetime.timedelta) -> Any:
    """nvtrain's store under in-process restart (``MASTER_PORT + 1``; ``hosts``: rank 0's
    process serves it). Also guards what NVRx's in-process stores unpickle
    (``nvtrain.nvrx.inprocess_store``) before its ``Wrapper`` first reads one."""
    inprocess_store.install(say)
    return _tcp_store(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]) + 1,
        hosts=hosts,
        world_size=world,
        timeout=timeout,
        multi_tenant=True,
        use_libuv=True,
        wait_for_workers=False,
    )


def guard_wrapper_store(wrapper: Any) -> None:
    """Make NVRx's ``Wrapper`` host its own store (``MASTER_PORT``, on rank 0) on a socket bound
    as the module says (``nvtrain.nvrx.inprocess_store.listening_store``)."""
    inprocess_store.use_listening_store(wrapper, listening_fd)

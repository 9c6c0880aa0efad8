"""The rendezvous store inside ft_launcher: where it listens, who may reach it, what it unpickles.

``nvtrain.nvrx.ftmain`` calls :func:`install` before ft_launcher starts (tuned or not). Each
change wraps one name of torch or NVRx and is made only where the module has the exact name it
expects; :func:`install` says what it did, for the launcher's log.

- **The store listens on the endpoint's address, not on every interface.** torch's TCPStore
  server binds the wildcard address whatever host it is given. Here the store's host (``is_host``)
  binds a socket itself, on the address the rendezvous endpoint names (``127.0.0.1`` in a job of
  one node; node 0's address, or what its name resolves to here, in a job of several), and hands
  it to TCPStore (``master_listen_fd``). A name none of whose addresses is this node's is bound
  on every interface as before, and the log says so.
- **Only the job's nodes get through** (``$NVTRAIN_STORE_ALLOW``, ``[rendezvous] store_allow``).
  A classic BPF socket filter on the listening socket drops every IPv4 packet whose source is not
  in the allow-list (SYNs included, and the accepted connections inherit the filter), and every
  IPv6 packet. The store's own address and loopback are always allowed.
- **The rendezvous state is read by an allow-listed unpickler.** NVRx's and torch's dynamic
  rendezvous keep their state in the store pickled (key ``torch.rendezvous.<run id>``) and read it
  back with ``pickle.loads``; whoever can write that key could run code in ft_launcher. Here the
  ``pickle`` those modules see reads only the classes the state is made of; a state that names
  anything else is refused, nothing of it runs, and the launcher's log names what it named.
"""

from __future__ import annotations

import importlib
import io
import ipaddress
import os
import pickle
import socket
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from nvtrain import storesocket
from nvtrain.storesocket import BACKLOG, MAX_NETWORKS, allow_filter, allowed_networks

__all__ = [
    "ALLOW_ENV",
    "BACKLOG",
    "MAX_NETWORKS",
    "RendezvousStateRefused",
    "allow_filter",
    "allowed_networks",
    "install",
    "listening_socket",
]

ALLOW_ENV = "NVTRAIN_STORE_ALLOW"
"""The hosts and networks that may reach the store: IPv4 addresses, CIDRs or names, separated
by spaces (``[rendezvous] store_allow``). Unset or empty: no filter."""

STORE_MODULES = (
    "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous.c10d_rendezvous_backend",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
)
"""Where the c10d rendezvous backend makes its TCPStore (``_create_tcp_store``): NVRx 0.4's copy
of torch elastic, torch's own (NVRx 0.6 and later)."""
STATE_MODULES = (
    "nvidia_resiliency_ext.fault_tolerance._ft_rendezvous",
    "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous.dynamic_rendezvous",
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
)
"""The dynamic rendezvous implementations that unpickle their state from the store."""
_LABELS = {
    STORE_MODULES[0]: "NVRx's c10d backend",
    STORE_MODULES[1]: "torch's c10d backend",
    STATE_MODULES[0]: "NVRx's rendezvous",
    STATE_MODULES[1]: "NVRx's copy of torch's dynamic rendezvous",
    STATE_MODULES[2]: "torch's dynamic rendezvous",
}


def _stderr(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


_say: list[Callable[[str], None]] = [_stderr]
"""Where the guards' lines go (``install``'s ``log``: ft_launcher's log line format)."""


def _log(message: str) -> None:
    _say[0](f"nvtrain ftmain: {message}")


class RendezvousStateRefused(pickle.UnpicklingError):
    """The rendezvous state read from the store names a class that the state is not made of."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"refused the rendezvous state read from the store: it names {name}, which is not "
            "part of a rendezvous state (another process wrote the store's rendezvous key); "
            "nothing of it was run"
        )


class _StateUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__(io.BytesIO(data))
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._allowed:
            raise RendezvousStateRefused(f"{module}.{name}")
        return super().find_class(module, name)


class _StatePickle(types.ModuleType):
    """The ``pickle`` module as a dynamic rendezvous sees it: ``loads`` admits only ``allowed``
    (and says so in the log when it refuses), every other name is the real module's."""

    def __init__(self, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__("pickle")
        self._allowed = allowed

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)

    def loads(self, data: bytes, /, **_: Any) -> Any:
        try:
            return _StateUnpickler(bytes(data), self._allowed).load()
        except RendezvousStateRefused as exc:
            _log(str(exc))
            raise


def _state_classes(module: types.ModuleType) -> frozenset[tuple[str, str]] | None:
    """What the rendezvous state of ``module`` is made of, None where it is not the module
    expected (no ``pickle``, ``_RendezvousState`` or ``_NodeDesc`` of its own)."""
    state, node = getattr(module, "_RendezvousState", None), getattr(module, "_NodeDesc", None)
    if (
        getattr(module, "pickle", None) is not pickle
        or not isinstance(state, type)
        or not isinstance(node, type)
    ):
        return None
    names = {(module.__name__, "_RendezvousState"), (module.__name__, "_NodeDesc"), ("datetime", "datetime")}
    worker_state = getattr(module, "WorkerState", None)  # NVRx keeps the nodes' worker states
    if isinstance(worker_state, type):
        names.add((worker_state.__module__, worker_state.__qualname__))
    return frozenset(names)


def listening_socket(host: str, port: int, allow: list[ipaddress.IPv4Network] | None = None) -> socket.socket:
    """The rendezvous store's socket (:func:`nvtrain.storesocket.listening_socket`): a fallback
    to every interface is told in the launcher's log."""
    return storesocket.listening_socket(host, port, allow, on_wildcard=_wildcard)


def _wildcard(host: str) -> None:
    _log(f"no address of {host!r} is this node's: the rendezvous store listens on every interface")


def _listening_store(
    make: Callable[..., Any], allow: list[ipaddress.IPv4Network] | None
) -> Callable[..., Any]:
    """``TCPStore`` as the c10d backend calls it: a server gets the socket of
    :func:`listening_socket` (clients are left as they are)."""

    def tcp_store(host_name: str, port: int, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("is_master") and kwargs.get("master_listen_fd") is None and not args:
            try:
                sock = listening_socket(host_name, port, allow)
            except OSError as exc:  # as torch's own bind fails: the backend reports it
                raise RuntimeError(
                    f"the rendezvous store cannot listen on {host_name}:{port}: {exc}"
                ) from exc
            kwargs["master_listen_fd"] = sock.detach()  # TCPStore owns (and closes) it
        return make(host_name, port, *args, **kwargs)

    tcp_store.__wrapped__ = make  # type: ignore[attr-defined]
    return tcp_store


def _params(function: Any) -> list[str] | None:
    import inspect

    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None


def install(env: Mapping[str, str] | None = None, log: Callable[[str], None] = _stderr) -> list[str]:
    """Guard the rendezvous store of this process (see the module's text); returns what was
    done, for the log. ``env``: where ``ALLOW_ENV`` is read (default: ``os.environ``); ``log``:
    where a refusal or a fallback is told. A bad allow-list ends the program (exit 2) with a
    line that names it."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    _say[0] = log

    text = (os.environ if env is None else env).get(ALLOW_ENV, "").strip()
    try:
        allow = allowed_networks(text.split()) if text else None
    except ValueError as exc:
        _log(f"usage error: ${ALLOW_ENV}: {exc}")
        raise SystemExit(2) from None
    done = []
    for name in STORE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        make = getattr(module, "TCPStore", None)
        if make is TCPStore and _params(getattr(module, "_create_tcp_store", None)) == ["params"]:
            module.TCPStore = _listening_store(make, allow)  # type: ignore[attr-defined]
            done.append(f"store bound to the endpoint's address ({_LABELS[name]})")
    if allow is not None and not done:
        # The list was asked for and this NVRx/torch makes its store where nvtrain cannot hand
        # it a filtered socket: running would leave the store open to every host.
        _log(
            f"usage error: ${ALLOW_ENV} ([rendezvous] store_allow) is set, but this NVRx creates its "
            "rendezvous store in a way nvtrain does not know (docs/nvrx.md), so the list cannot be "
            "applied; use a tested NVRx release, or firewall the rendezvous port and empty store_allow"
        )
        raise SystemExit(2)
    if allow is not None:
        done.append(f"store reachable from {' '.join(str(net) for net in allow)} only")
    for name in STATE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        allowed = _state_classes(module)
        if allowed is not None:
            module.pickle = _StatePickle(allowed)  # type: ignore[attr-defined]
            done.append(f"rendezvous state unpickled allow-listed ({_LABELS[name]})")
    if not any(item.startswith("rendezvous state") for item in done):
        _log(
            "warning: this NVRx keeps its rendezvous state where nvtrain does not know it: it is "
            "read back unguarded, so whoever can reach the store could run code here (docs/security.md)"
        )
    return done

"""NVRx's in-process restart stores as the workers use them: where the ``Wrapper``'s store
listens, and what NVRx unpickles from its stores.

- **What NVRx unpickles.** ``StoreMixin.get_states`` and ``get_keys``
  (``nvidia_resiliency_ext.inprocess.store``) read the ranks' states and grouping keys back with
  ``pickle.loads``; NVRx 0.4.1 calls them from its ``Tree`` rank assignment (``build_tree``),
  which the ``Wrapper`` nvtrain builds does not use (its default, ``ActivateAllRanks`` and
  ``ShiftRanks``, reads no state). Guarded all the same (:func:`install`): the ``pickle`` that
  module sees admits only what NVRx puts there, its ``State`` and ``Mode`` (and plain values:
  the keys are strings); a value that names anything else is refused, nothing of it runs, and
  the worker says what it named.
- **Where the Wrapper's store listens.** The ``Wrapper`` makes its store (``MASTER_PORT``,
  hosted by rank 0) with NVRx's ``TCPStore``, which torch binds on every interface.
  :func:`use_listening_store` gives the Wrapper a subclass whose host rank listens on a socket
  nvtrain binds (``listen(host, port)``: ``nvtrain.worker.stores``); the other ranks, and rank
  0's own monitor process (whose bind finds the port held), are clients as with NVRx's.

Each change is made only where NVRx has the exact names expected; NVRx is imported inside the
functions.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import inspect
import io
import os
import pickle
import types
from collections.abc import Callable
from typing import Any

from nvtrain.nvrx.messages import PACKAGE

__all__ = ["STATE_MODULE", "STORE_MODULE", "InprocessStoreRefused", "install", "use_listening_store"]

STORE_MODULE = f"{PACKAGE}.inprocess.store"
"""Where ``StoreMixin`` (``get_states``, ``get_keys``) and NVRx's ``TCPStore`` live."""
STATE_MODULE = f"{PACKAGE}.inprocess.state"
"""Where the classes of a rank's state live (``State``, ``Mode``)."""
_STORE_PARAMS = [
    "self",
    "host_name",
    "port",
    "world_size",
    "timeout",
    "wait_for_workers",
    "multi_tenant",
    "use_libuv",
]
"""NVRx's ``TCPStore.__init__`` as :func:`use_listening_store` knows it (0.4.1)."""


class InprocessStoreRefused(pickle.UnpicklingError):
    """A value read from an in-process restart store names a class NVRx does not put there."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"refused a rank state read from NVRx's in-process store: it names {name}, which NVRx "
            "does not write there (another process wrote the store's key); nothing of it was run"
        )


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__(io.BytesIO(data))
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._allowed:
            raise InprocessStoreRefused(f"{module}.{name}")
        return super().find_class(module, name)


class _GuardedPickle(types.ModuleType):
    """``pickle`` as NVRx's store module sees it: ``loads`` admits only ``allowed`` and tells
    ``say`` when it refuses; every other name is the real module's (``dumps``)."""

    def __init__(self, allowed: frozenset[tuple[str, str]], say: Callable[[str], None]) -> None:
        super().__init__("pickle")
        self._allowed = allowed
        self._say = say

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)

    def loads(self, data: bytes, /, **_: Any) -> Any:
        try:
            return _Unpickler(bytes(data), self._allowed).load()
        except InprocessStoreRefused as exc:
            with contextlib.suppress(Exception):
                self._say(str(exc))
            raise


def install(say: Callable[[str], None]) -> bool:
    """Guard what NVRx's in-process stores unpickle (see the module's text); False where the
    installed NVRx is not as expected (no such module, or no ``pickle``, ``State``, ``Mode``
    of its own), then nothing is changed. Idempotent."""
    try:
        store = importlib.import_module(STORE_MODULE)
        state = importlib.import_module(STATE_MODULE)
    except ImportError:
        return False
    current = getattr(store, "pickle", None)
    if isinstance(current, _GuardedPickle):
        return True
    mixin = getattr(store, "StoreMixin", None)
    if (
        current is not pickle
        or not isinstance(mixin, type)
        or not all(callable(getattr(mixin, m, None)) for m in ("get_states", "get_keys"))
        or not all(isinstance(getattr(state, c, None), type) for c in ("State", "Mode"))
    ):
        return False
    allowed = frozenset({(STATE_MODULE, "State"), (STATE_MODULE, "Mode")})
    store.pickle = _GuardedPickle(allowed, say)  # type: ignore[attr-defined]
    return True


def _listening_store_class(base: type, listen: Callable[[str, int], int]) -> type:
    """NVRx's ``TCPStore`` (``base``), its host rank serving on ``listen(host, port)``'s socket."""
    import torch.distributed as dist

    torch_store: Any = dist.TCPStore  # type: ignore[attr-defined]

    class ListeningTCPStore(base):  # type: ignore[misc]
        """NVRx's in-process ``TCPStore`` on a socket bound by nvtrain (rank 0 hosts it)."""

        def __init__(
            self,
            host_name: str | None = None,
            port: int | None = None,
            world_size: int | None = None,
            timeout: datetime.timedelta = datetime.timedelta(seconds=300),
            wait_for_workers: bool = True,
            multi_tenant: bool = False,
            use_libuv: bool = True,
        ) -> None:
            host = os.environ["MASTER_ADDR"] if host_name is None else host_name
            port = int(os.environ["MASTER_PORT"]) if port is None else port
            kwargs: dict[str, Any] = {
                "host_name": host,
                "port": port,
                "world_size": int(os.environ["WORLD_SIZE"]) if world_size is None else world_size,
                "timeout": timeout,
                "wait_for_workers": wait_for_workers,
                "multi_tenant": multi_tenant,
                "use_libuv": use_libuv,
            }
            if int(os.environ["RANK"]) == self.TCP_STORE_HOST_RANK:
                fd: int | None = None
                with contextlib.suppress(OSError):  # held: this rank's store (its monitor process)
                    fd = listen(host, port)
                if fd is not None:
                    try:
                        torch_store.__init__(self, is_master=True, master_listen_fd=fd, **kwargs)
                        return
                    except Exception:  # noqa: BLE001 - as NVRx's own: a client then
                        with contextlib.suppress(OSError):
                            os.close(fd)
            torch_store.__init__(self, is_master=False, **kwargs)

    return ListeningTCPStore


def use_listening_store(wrapper: Any, listen: Callable[[str, int], int]) -> bool:
    """Make ``wrapper`` (NVRx's ``Wrapper``) host its store on ``listen(host, port)``'s socket,
    a file descriptor that TCPStore then owns (``listen`` raises OSError when the port is held).
    False where the Wrapper's store is not NVRx's ``TCPStore`` as expected: left as it is."""
    try:
        store = importlib.import_module(STORE_MODULE)
    except ImportError:
        return False
    base: Any = getattr(store, "TCPStore", None)
    if getattr(wrapper, "store_factory", None) is not base or not isinstance(base, type):
        return False
    try:  # NVRx's own __init__, not one it inherits
        params = list(inspect.signature(vars(base).get("__init__")).parameters)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    if params != _STORE_PARAMS or not isinstance(getattr(base, "TCP_STORE_HOST_RANK", None), int):
        return False
    wrapper.store_factory = _listening_store_class(base, listen)
    return True

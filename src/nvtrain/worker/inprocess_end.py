"""The end of a run that finished under NVRx's in-process restart: every rank's monitor process
stops before the store it reads goes away.

Each rank's NVRx ``Wrapper`` forks a monitor process, whose sibling monitor thread reads the
peers' heartbeats from the Wrapper's store; the process of rank 0 hosts that store (and
nvtrain's, under it). When the wrapped function returns, the Wrapper only asks its monitor
process to stop and lets go of the store: rank 0 then closed the store, or exited, while the
monitors still read it, and their threads died on ``DistNetworkError`` (a ``worker_thread_error``
at the end of every clean run). Here each rank waits for its own monitor process to end and
says so in nvtrain's store, and the process hosting the stores keeps them (and the Wrapper's
state that holds them) until every rank has, or for ``LIMIT_S`` at most.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from typing import Any

__all__ = ["LIMIT_S", "POLL_S", "finish", "last_world"]

LIMIT_S = 10.0
"""The longest a finished rank waits: a monitor process stops within its interval and the
heartbeat interval (1 s at most each); a rank that does not come is not waited for longer."""
POLL_S = 0.02
"""How often a rank looks whether its monitor process has ended."""


def _running(process: Any) -> bool:
    """Whether the (psutil) ``process`` still runs: a zombie has ended (it is not our child, so
    not ours to reap)."""
    try:
        return bool(process.is_running()) and process.status() != "zombie"
    except Exception:  # noqa: BLE001 - psutil's NoSuchProcess and the like: gone
        return False


def _key(iteration: int, rank: int) -> str:
    return f"nvtrain-finished-{iteration}-{rank}"


def last_world(call_wrapper: Any) -> tuple[int, int]:
    """This rank's index and the number of ranks in the last attempt: the active rank and world
    size of the Wrapper's state (a world that shrank when the in-process layer dropped a rank, by
    ``[restart.in_process] min_world_size``), which NVRx also puts in ``RANK`` and
    ``WORLD_SIZE`` before each attempt; those when the state does not say (no attempt ran)."""
    state = getattr(call_wrapper, "state", None)
    rank, world = getattr(state, "active_rank", None), getattr(state, "active_world_size", None)
    if isinstance(rank, int) and isinstance(world, int) and 0 <= rank < world:
        return rank, world
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def finish(call_wrapper: Any, store: Any, *, hosts: bool, limit: float = LIMIT_S) -> None:
    """After the wrapped function returned on this rank: wait for this rank's NVRx monitor
    process (``call_wrapper``'s) to end, tell ``store`` (nvtrain's, hosted with the Wrapper's by
    the process of the first rank 0), and there (``hosts``) wait until every rank of the last
    attempt has. Bounded by ``limit`` seconds in all; what fails is not waited for."""
    deadline = time.monotonic() + limit
    monitor = getattr(getattr(call_wrapper, "monitor_process", None), "process_monitor_proc", None)
    while monitor is not None and _running(monitor) and time.monotonic() < deadline:
        time.sleep(POLL_S)  # not our child (NVRx forks it twice): nothing to wait on but its state
    iteration = int(getattr(call_wrapper, "iteration", 0) or 0)
    rank, world = last_world(call_wrapper)
    with contextlib.suppress(Exception):  # the store's: a rank gone, or the limit reached
        store.set(_key(iteration, rank), "1")
        if hosts:
            left = datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.1))
            store.wait([_key(iteration, r) for r in range(world)], left)

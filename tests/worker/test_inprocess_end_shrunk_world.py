"""``inprocess_end.finish`` waits for the ranks of the last attempt's world, not for
``WORLD_SIZE`` as the workers started: after the in-process layer dropped a rank (a world that
shrank under ``[restart.in_process] min_world_size``), rank 0 does not wait its whole limit for a
rank that is gone.

The store is a real TCPStore hosted here; the attempt's world is NVRx's own ``State`` (what the
Wrapper's ``CallWrapper.state`` holds after its rank assignment: rank 1 of 2 dropped, the active
world is rank 0 alone). A drop-a-rank ``nvtrain run`` cannot end this way: ft_launcher restarts
every worker when one dies, so the run's end never sees the shrunk world.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any

import pytest

from support.ports import free_port

pytest.importorskip("torch")


@dataclasses.dataclass
class _Attempt:
    """What ``finish`` reads of NVRx's CallWrapper: its state and iteration (no monitor here)."""

    state: Any
    iteration: int


def _shrunk_state() -> Any:
    from nvidia_resiliency_ext.inprocess.state import Mode, State

    return State(
        rank=0,
        world_size=1,
        mode=Mode.ACTIVE,
        active_rank=0,
        active_world_size=1,
        initial_rank=0,
        initial_world_size=2,
    )


def test_rank_0_waits_for_the_last_attempts_world_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from nvtrain.worker import inprocess_end

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # the world the workers started with
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1",
        free_port(),
        world_size=1,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )
    attempt = _Attempt(_shrunk_state(), iteration=1)
    began = time.monotonic()
    inprocess_end.finish(attempt, store, hosts=True, limit=8.0)
    took = time.monotonic() - began
    assert took < 4.0, f"rank 0 waited {took:.1f} s of its 8 s limit for a rank that was dropped"
    assert store.get("nvtrain-finished-1-0") == b"1"
    assert inprocess_end.last_world(attempt) == (0, 1)

"""Deterministic fault injection from the policy's ``[[faults]]`` (tests and benchmarks only).

Each fault fires once per run, across restarts of every layer: before firing, the rank creates
``<run dir>/faults/<index>.fired`` with O_EXCL (and fsyncs it), so a restarted worker that
replays the step sees the marker and goes on.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from nvtrain.config.schema import Fault
from nvtrain.events import EventLog
from nvtrain.events.records import FaultInjected

__all__ = ["FaultInjector", "InjectedFault"]


class InjectedFault(RuntimeError):
    """Raised by an ``exception`` fault."""


class FaultInjector:
    def __init__(self, faults: list[Fault], state_dir: Path, events: EventLog | None) -> None:
        self.faults = list(enumerate(faults))
        self.state_dir = state_dir
        self.events = events

    def _claim(self, index: int) -> bool:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.state_dir / f"{index}.fired", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return False
        try:
            os.write(fd, f"{time.time()}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def maybe_fire(self, step: int, rank: int) -> None:
        """Fire the fault planned for ``step`` on ``rank``, unless it already fired."""
        for index, fault in self.faults:
            if fault.step != step or fault.rank != rank or not self._claim(index):
                continue
            if self.events is not None:
                self.events.emit(FaultInjected(step=step, rank=rank, kind=fault.kind))
            self._fire(fault.kind, step, rank)

    @staticmethod
    def _fire(kind: str, step: int, rank: int) -> None:
        if kind == "exception":
            raise InjectedFault(f"injected exception at step {step} on rank {rank}")
        if kind == "hang":
            while True:  # stuck in Python: no progress, no heartbeats, but interruptible
                time.sleep(0.05)
        if kind == "collective_hang":
            import torch
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                # A receive that no peer ever matches: blocked in C until the group's timeout.
                peer = (dist.get_rank() + 1) % dist.get_world_size()
                dist.recv(torch.zeros(1), src=peer, tag=7331)
            time.sleep(10**7)
        if kind == "collective_sigkill":
            import torch
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                # Dies with a receive posted: the peers meet a dead rank inside a collective.
                peer = (dist.get_rank() + 1) % dist.get_world_size()
                dist.irecv(torch.zeros(1), src=peer, tag=7332)
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10**7)
        if kind == "oom":
            os._exit(137)

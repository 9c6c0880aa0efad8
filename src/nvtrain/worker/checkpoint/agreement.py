"""Rank agreement: what every rank of a checkpoint decides together, and the group it uses.

Owns the checkpoint's own gloo group (background saves coordinate there, never on the training
loop's) and the few collectives on it: the token naming a save, the list of committed steps
every rank tries to restore (rank 0's), whether every rank has something, the first rank's
problem with a checkpoint, and passing each rank's outcome of a save around. Without an
initialised process group this rank is the whole world and every agreement is its own.
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from nvtrain.worker.checkpoint.layout import committed_steps

__all__ = ["Ranks"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This rank, the world and the checkpoint's group (None when not distributed)."""

    distributed: bool
    rank: int
    world: int
    group: Any

    @classmethod
    def join(cls) -> Ranks:
        """This process's place in the initialised process group (if any), with a new gloo
        group of its own: a collective, so every rank calls it at the same point."""
        distributed = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if distributed else 0
        world = dist.get_world_size() if distributed else 1
        group = dist.new_group(backend="gloo") if distributed else None
        return cls(distributed, rank, world, group)

    def token(self) -> str:
        """Rank 0's fresh token, the same on every rank: names one save."""
        token = [secrets.token_hex(4)]
        if self.distributed:
            dist.broadcast_object_list(token, src=0, group=self.group)
        return str(token[0])

    def agreed_steps(self, run_dir: Path) -> list[int]:
        """The committed steps as rank 0 sees them, so every rank tries the same list (a
        commit landing between two ranks' listings would otherwise split them)."""
        steps = [committed_steps(run_dir)]
        if self.distributed:
            dist.broadcast_object_list(steps, src=0, group=self.group)
        return list(steps[0])

    def everyone(self, mine: bool) -> bool:
        """True when ``mine`` is true on every rank."""
        if not self.distributed:
            return mine
        flag = torch.tensor([1 if mine else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def first_problem(self, problem: str | None) -> str | None:
        """Every rank: the first rank's problem with a checkpoint (naming the rank when there
        are several), or None when every rank found none."""
        if not self.distributed:
            return problem
        everyone: list[str | None] = [None] * self.world
        dist.all_gather_object(everyone, problem, group=self.group)
        found = [(rank, p) for rank, p in enumerate(everyone) if p is not None]
        return None if not found else f"{found[0][1]} (found by rank {found[0][0]})"

    def all_gather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order."""
        if not self.distributed:
            return [value]
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, value, group=self.group)
        return everyone

    def from_rank0(self, value: T) -> T:
        """Rank 0's ``value`` on every rank."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

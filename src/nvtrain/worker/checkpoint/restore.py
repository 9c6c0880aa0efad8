"""Restoring: the newest committed checkpoint of this run, from the nearest source that has it.

Four sources, tried in this order, each only when every rank can use it: the staged copy this
process kept in memory (after an in-process restart), the host copy in this pod's files
(``hostcopy``), the copy a rank of another pod kept for a replaced one (``peercopy``), and
storage. On storage, the newest committed checkpoint whose files all match their manifests
(``layout.verify``) and whose ``extra-rank*.pt``, ``.metadata`` and shards hold only plain data
(``plain``) is loaded; rank 0 rejects (moves aside, once every rank agreed) the newer ones that
do not and the step folders without COMMITTED, so no later save or retention takes them for
good ones.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from nvtrain.events.records import CheckpointCorrupt, CheckpointPartial, CheckpointRestored
from nvtrain.worker.checkpoint import layout, staging
from nvtrain.worker.checkpoint.core import CheckpointerCore
from nvtrain.worker.hostcopy import Layout, Unsupported
from nvtrain.worker.plain import MetadataReader, PlainLoadPlanner, Refused, load_plain, read_metadata, refusal

__all__ = ["Restoring"]


class _Before:
    """What a restore that loads nothing must put back. Reading the live state as a state dict
    (``get_state_dict``, which the host copy, the peers and DCP's loader need) first creates an
    optimizer's state when it has none, by a step of its own on zero gradients with the learning
    rate at 0: AdamW's parameters stay, but its state then holds ``step`` 1 and zeroed moments,
    which the first real step would count on. Dropping that state again gives the optimizer a
    fresh one's, which its first step makes as it would have; the RNG states are put back too."""

    def __init__(self, optimizer: torch.optim.Optimizer | None, rng: dict[str, Any]) -> None:
        self.optimizer = optimizer
        self.rng = rng

    @classmethod
    def take(cls, optimizer: torch.optim.Optimizer | None) -> _Before:
        stateless = optimizer is not None and not optimizer.state
        return cls(optimizer if stateless else None, staging.rng_state())

    def put_back(self) -> None:
        if self.optimizer is not None:
            self.optimizer.state.clear()
        staging.set_rng_state(self.rng)


class Restoring(CheckpointerCore):
    """The restoring half of the ``Checkpointer``."""

    def restore(self) -> int:
        """Load the newest intact committed checkpoint of this run; returns its step (0: none,
        and then the model, the optimizer and the RNG states are as they were before: a fresh
        start, bitwise, whatever reading the state on the way made)."""
        before = _Before.take(self.optimizer)
        step = self._restore()
        if step == 0:
            before.put_back()
        return step

    def _restore(self) -> int:
        t0 = time.monotonic()
        if self.rank == 0:
            for entry, step in layout.uncommitted_steps(self.run_dir):  # a commit is renamed in whole
                self._reject(entry, step, f"no {layout.COMMITTED} file")
        steps = self.ranks.agreed_steps(self.run_dir)
        newest_committed = max(steps, default=0)
        if self.rank == 0:
            for entry, step in layout.partial_steps(self.run_dir):
                if step > newest_committed:
                    self._emit(CheckpointPartial(path=str(entry), step=step))
        if self._restore_from_memory(newest_committed, t0):
            return newest_committed
        return self._restore_from_storage(steps, t0)

    # -- storage -------------------------------------------------------------------------------
    def _read_plain(self, folder: Path) -> tuple[str | None, dict[str, Any] | None]:
        """This rank's extra state of the checkpoint in ``folder`` read as plain data, and rank
        0's check of DCP's ``.metadata`` (every rank reads it through ``MetadataReader`` too):
        (what was refused, the extra state)."""
        name = f"extra-rank{self.rank}.pt"
        extra = None
        try:
            if (folder / name).is_file():
                extra = load_plain(folder / name, legacy_numpy=True, what=name)
            if self.rank == 0:
                with (folder / ".metadata").open("rb") as stream:
                    read_metadata(stream)
        except Refused as exc:
            return str(exc), None
        except OSError as exc:
            return f"cannot read it: {layout.os_error_text(exc)}", None
        if extra is not None and not isinstance(extra, dict):
            return f"{name} holds a {type(extra).__name__}, not the extra state", None
        return None, extra

    def _restore_from_storage(self, steps: list[int], t0: float) -> int:
        with self._paused():
            for step in reversed(steps):
                folder = layout.step_dir(self.run_dir, step)
                problem = layout.verify(folder, step, rank=self.rank, world=self.world)
                extra = None
                if problem is None:
                    problem, extra = self._read_plain(folder)
                problem = self.ranks.first_problem(problem)
                if problem is None:
                    try:
                        self._load(folder, extra)
                    except (Exception, CheckpointException) as exc:
                        refused = refusal(exc)
                        if refused is None:
                            raise
                        problem = f"{refused} (read by torch's loader)"  # every rank raised it
                if problem is not None:
                    self._emit(CheckpointCorrupt(step=step, path=str(folder), problem=problem))
                    if self.rank == 0:  # every rank is done with it (the all-gather above)
                        self._reject(folder, step, problem)
                    continue
                self.last_saved = self.newest_committed = step
                self._emit(
                    CheckpointRestored(
                        step=step,
                        origin="storage",
                        seconds=round(time.monotonic() - t0, 6),
                        bytes=self._state_bytes(),
                        memory_problem=self.memory_problem,
                    )
                )
                return step
        return 0

    def _state_bytes(self) -> int:
        """Bytes of this rank's model + optimizer state (what a restore brought back)."""
        with contextlib.suppress(Exception):
            return staging.nbytes(self._state())
        return 0

    def _load(self, folder: Path, extra: dict[str, Any] | None) -> None:
        """Load the shards in ``folder`` (nothing unpickled with code: ``plain``) and apply them
        with ``extra``, this rank's extra state as ``_read_plain`` read it."""
        state = self._state()
        dcp_load(
            state,
            checkpoint_id=str(folder),
            storage_reader=MetadataReader(str(folder)),
            planner=PlainLoadPlanner(),
            process_group=self.group,
        )
        self._apply(state, extra)

    def _apply(self, state: dict[str, Any], extra: dict[str, Any] | None) -> None:
        if self.optimizer is not None:
            set_state_dict(
                self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )
        else:
            set_state_dict(self.model, [], model_state_dict=state["model"], optim_state_dict={})
        if extra is not None:
            staging.set_rng_state(extra["rng"])
            for key, value in extra["extra"].items():
                target = self.extra.get(key)
                if target is not None and hasattr(target, "load_state_dict"):
                    target.load_state_dict(value)

    # -- memory, host copy, peer ---------------------------------------------------------------
    def _restore_from_memory(self, newest: int, t0: float) -> bool:
        """After an in-process restart every rank may still hold the staged copy of the newest
        committed checkpoint: then load it from host memory instead of storage."""
        if self.host is not None or self.peers is not None:
            return self._restore_from_host(newest, t0)
        held = staging.held(self.run_dir) if self.policy.in_memory else None
        mine = held is not None and newest > 0 and held.step == newest
        if not self.ranks.everyone(mine) or held is None:
            return False
        from torch.distributed._state_dict_utils import _copy_state_dict

        live = self._state()
        restored = _copy_state_dict(held.state, live, non_blocking=torch.cuda.is_available())
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._apply(restored, held.extra)
        self.last_saved = self.newest_committed = newest
        self._emit(
            CheckpointRestored(
                step=newest,
                origin="memory",
                seconds=round(time.monotonic() - t0, 6),
                bytes=staging.nbytes(live),
            )
        )
        return True

    def _restore_from_host(self, newest: int, t0: float) -> bool:
        """Load the host copy of the newest committed checkpoint that this pod's files hold (see
        ``hostcopy``), when every rank has a good one; ranks of a replaced pod first get theirs
        from the pod that kept it (``peercopy``). Else note why for the storage restore."""
        slot, why, origin = None, "no checkpoint committed yet", "memory"
        live: Any = None
        token: str | None = None
        if newest > 0:
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
                folder = layout.step_dir(self.run_dir, newest)
                committed = json.loads((folder / layout.COMMITTED).read_text())
                token = committed.get("token")
            try:
                live = self._state()
                if self.host is None:
                    why = "this rank keeps no host copy"
                else:
                    slot, why = self.host.find(step=newest, token=token, state=live)
            except Unsupported as exc:
                why = str(exc)
        if self.peers is not None and newest > 0:
            slot, why, origin = self._from_peer(newest, token, live, slot, why)
        agreed = self.ranks.everyone(slot is not None)
        if not agreed or slot is None:
            self.memory_problem = why or "another rank has no usable copy"
            return False
        assert self.host is not None
        failed = ""
        try:
            state, extra = self.host.load(slot, live)
            self._apply(state, extra)
        except Exception as exc:  # noqa: BLE001 - every rank then reads storage, which overwrites it all
            failed = f"loading it failed: {exc!r}"[:300]
        if not self.ranks.everyone(not failed):
            self.memory_problem = failed or "loading it failed on another rank"
            return False
        self.last_saved = self.newest_committed = newest
        self._emit(
            CheckpointRestored(
                step=newest,
                origin=origin,
                seconds=round(time.monotonic() - t0, 6),
                bytes=staging.nbytes(live),
            )
        )
        return True

    def _from_peer(
        self, step: int, token: str | None, live: Any, slot: Any, why: str
    ) -> tuple[Any, str, str]:
        """Every rank: the ranks without a copy of their own get theirs from the rank that kept
        it, when every one of them can. Returns this rank's (slot, why not, origin)."""
        assert self.peers is not None
        peers = self.peers
        needing, problem = peers.plan(slot is not None, peers.holds(step=step, token=token), self.group)
        if not needing:
            return slot, why, "memory"
        if problem:
            return slot, f"{why}; {problem}" if why else problem, "memory"
        try:
            layout_of = Layout.of(live) if live is not None else None
            got, problem = peers.bring_back(needing, self.host, layout_of)
        except Exception as exc:  # noqa: BLE001 - every rank then reads storage
            got, problem = None, f"receiving it failed: {exc!r}"[:300]
        if self.rank not in needing:
            return slot, why, "memory"
        if got is None or self.host is None:
            return None, problem or "no copy came from the peer", "peer"
        slot, why = self.host.find(step=step, token=token, state=live)
        return slot, (f"the copy rank {peers.buddy} kept: {why}" if why else ""), "peer"

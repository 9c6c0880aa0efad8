"""Staging: copying the state into host memory, the one part of a save that blocks training.

Owns the reused host buffers a save stages into (when no host copy in files is kept: that is
``hostcopy``), the per-rank state besides the model's (RNG states as plain data), the size of a
state, and the staged copy of the newest written checkpoint that this process keeps for an
in-process restart (``held`` / ``hold`` / ``forget``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
from pathlib import Path
from typing import Any

import torch

__all__ = ["Held", "ReusedBufferStager", "forget", "hold", "held", "nbytes", "rng_state", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """The RNG states as plain data (what ``torch.load(weights_only=True)`` reads back): numpy's
    ``get_state()`` tuple holds an array, kept here as a list of its integers."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    with contextlib.suppress(ImportError):
        import numpy

        kind, keys, pos, has_gauss, gauss = numpy.random.get_state()
        state["numpy"] = {
            "kind": str(kind),
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        }
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        with contextlib.suppress(ImportError):
            import numpy

            saved = state["numpy"]
            if isinstance(saved, dict):
                keys = numpy.array(saved["keys"], dtype=numpy.uint32)
                saved = (saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["gauss"])
            numpy.random.set_state(saved)  # (a tuple: written before plain RNG states)


def nbytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if hasattr(state, "_local_tensor"):
        return nbytes(state._local_tensor)
    if isinstance(state, dict):
        return sum(nbytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(nbytes(v) for v in state)
    return 0


class ReusedBufferStager:
    """Stages a state dict into host buffers allocated once and reused by every later save.

    On a GPU the buffers are pinned and the copies are non-blocking, followed by one
    synchronisation: the training loop is blocked for about state bytes / pinned device-to-host
    bandwidth. The next save starts only after the previous one is written, so reusing the
    buffers is safe. (Implements torch's ``AsyncStager`` protocol; the returned dict goes to
    ``async_save`` as it is.)
    """

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buffer: Any = None
        self.last_staged: Any = None
        self.signature: Any = None

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    @staticmethod
    def _signature(state: Any) -> Any:
        if isinstance(state, dict):
            return tuple((k, ReusedBufferStager._signature(v)) for k, v in state.items())
        if isinstance(state, list | tuple):
            return tuple(ReusedBufferStager._signature(v) for v in state)
        if isinstance(state, torch.Tensor):
            local = state.to_local() if hasattr(state, "to_local") else state
            return (tuple(local.shape), local.dtype)
        return type(state).__name__

    def stage(self, state_dict: Any) -> Any:
        from torch.distributed._state_dict_utils import _copy_state_dict

        cuda = torch.cuda.is_available()
        self.prepare(state_dict)
        staged = _copy_state_dict(state_dict, self.buffer, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize()
        self.last_staged = staged
        return staged

    def synchronize_staging(self) -> None:
        return None

    def prepare(self, state_dict: Any) -> None:
        """Allocate (and pin) the buffers for ``state_dict`` now, not at the first save."""
        from torch.distributed._state_dict_utils import _create_cpu_state_dict

        signature = self._signature(state_dict)
        with self.lock:
            if self.buffer is None or signature != self.signature:
                self.buffer = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
                self.signature = signature

    def close(self) -> None:
        self.buffer = self.last_staged = None


@dataclasses.dataclass
class Held:
    """The staged copy of this rank's newest written checkpoint, kept in host memory."""

    step: int
    state: Any
    extra: dict[str, Any]


_IN_MEMORY: dict[str, Held] = {}
"""Per run directory; survives in-process restarts (same process), not process restarts."""


def held(run_dir: Path) -> Held | None:
    """The staged copy this process keeps for ``run_dir``, if any."""
    return _IN_MEMORY.get(str(run_dir))


def hold(run_dir: Path, copy: Held) -> None:
    """Keep ``copy`` (its files and manifest are written) for an in-process restart."""
    _IN_MEMORY[str(run_dir)] = copy


def forget(run_dir: Path, step: int | None = None) -> None:
    """Drop the staged copy kept for ``run_dir`` (only when it is of ``step``, when given)."""
    copy = _IN_MEMORY.get(str(run_dir))
    if copy is not None and (step is None or copy.step == step):
        _IN_MEMORY.pop(str(run_dir), None)

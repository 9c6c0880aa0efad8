"""An ``accelerate`` training loop under the worker library: the loop iterates a ``Loop``.

    import nvtrain.integrations.accelerate as nvacc

    def main(ctx):
        accelerator = Accelerator()
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
        loop = nvacc.Loop(ctx, accelerator, model, optimizer, loader, scheduler=scheduler, max_steps=1000)
        for step, batch in loop:                 # instead of: for epoch ...: for batch in loader:
            loss = model(batch)
            accelerator.backward(loss)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()

    if __name__ == "__main__":
        nvacc.run(main)                          # instead of main()

``Loop(...)`` binds the checkpointer to the (unwrapped) model, the optimizer, the scheduler, the
grad scaler, the loop's position (epoch, batch) and the sampler's generators, and restores the
newest checkpoint. Iterating it yields ``(step, batch)`` from ``start_step + 1`` to
``max_steps`` over as many epochs as that takes; once the loop body has run, a batch that ended
an optimizer step (``accelerator.sync_gradients``) calls ``ctx.step_done(step)``: heartbeat,
progress, async save when due, faults, events. A resumed epoch is the same epoch: the RNG states and the
sampler's generators are set to what they were when the epoch's iterator was made, the batches
already trained are skipped (``accelerator.skip_first_batches``, in a section), then the RNG
states of the checkpoint's step are set again. ``loop.section()`` covers an evaluation or a save of your own.
The checkpoint interval is the policy's ``[checkpoint] interval``, or a tenth of ``max_steps``
when the policy leaves it unset (``cadence``).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import nvtrain.worker as nw
from nvtrain.integrations import private_api
from nvtrain.integrations.cadence import apply_cadence
from nvtrain.integrations.core import (
    Hooks,
    IntegrationError,
    Stateful,
    epoch_start,
    generators,
    replay_epoch_start,
)
from nvtrain.integrations.core import run as _run

__all__ = ["Loop", "run"]

_accelerate = importlib.import_module("accelerate")

T = TypeVar("T")
_END = object()


def run(main: Callable[[nw.Context], T]) -> T:
    """``nvtrain.worker.run(main)``: ``main(ctx)`` under in-process restart. Every attempt
    starts with accelerate's process-wide state forgotten (the ``Accelerator`` of the next
    attempt is made again for its new process group)."""
    return _run(main, before_attempt=private_api.checked_reset_accelerate_state)


class Loop:
    """Steps of an accelerate training loop (see the module docstring)."""

    def __init__(
        self,
        ctx: nw.Context,
        accelerator: Any,
        model: Any,
        optimizer: Any,
        loader: Any,
        *,
        max_steps: int,
        scheduler: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        if max_steps < 1:
            raise IntegrationError(f"Loop(max_steps={max_steps}): the number of optimizer steps must be >= 1")
        try:
            self.batches_per_epoch = len(loader)
        except TypeError:
            raise IntegrationError(
                f"Loop(loader=...): a {type(loader).__name__} has no length; the loop resumes "
                "mid-epoch by counting batches and needs a map-style data loader"
            ) from None
        self.ctx = ctx
        self.accelerator = accelerator
        self.loader = loader
        self.max_steps = max_steps
        self.hooks = Hooks(ctx)
        self.epoch = 0
        self.batch = 0
        """Batches of ``epoch`` trained (the position a checkpoint keeps)."""
        self._epoch_start: dict[str, Any] | None = None
        """What decided this epoch's order (``core.epoch_start``): a resume replays it."""
        self._generators_after: list[Any] | None = None
        """The generators' states after a finished epoch, for a resume at the next one."""
        extras: dict[str, Any] = {"loop": Stateful(self._state, self._load)}
        if scheduler is not None:
            extras["scheduler"] = scheduler
        scaler = getattr(accelerator, "scaler", None)
        if scaler is not None:
            extras["scaler"] = scaler
        for key, value in (extra or {}).items():
            if key in extras:
                raise IntegrationError(f"Loop(extra=...): the key {key!r} is the loop's own; rename it")
            extras[key] = value
        apply_cadence(ctx, own=None, own_name="", max_steps=max_steps)
        self.start_step = self.hooks.bind(accelerator.unwrap_model(model), optimizer, extras)
        self.step = self.start_step

    def _state(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "epoch_start": self._epoch_start,
            "generators_now": [g.get_state() for g in generators(self.loader)],
        }

    def _load(self, state: dict[str, Any]) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        self._epoch_start = state["epoch_start"]
        if self.batch >= self.batches_per_epoch:  # saved at the end of an epoch: the next one,
            self.epoch, self.batch = self.epoch + 1, 0  # its order drawn where the last one ended
            self._epoch_start = None
            self._generators_after = list(state["generators_now"])

    def section(self, limit: float | None = None) -> contextlib.AbstractContextManager[None]:
        """A stretch that is not a training step (evaluation, a save of your own)."""
        return self.hooks.section(limit)

    def _begin_epoch(self, resumed: bool) -> tuple[Iterator[Any], Any]:
        """This epoch's iterator and its first batch (``_END`` for none): resumed mid-epoch, the
        order the epoch had, the batches trained skipped, then the checkpoint's RNG states."""
        set_epoch = getattr(self.loader, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)
        skip = self.batch if resumed else 0
        if skip and self._epoch_start is not None:
            replay_epoch_start(self.loader, self._epoch_start)  # this epoch's order again
        else:
            if resumed:  # a new epoch after a save at the end of the last one
                self.hooks.reapply_rng()
                for generator, state in zip(
                    generators(self.loader), self._generators_after or [], strict=False
                ):
                    generator.set_state(state)
            self._epoch_start = epoch_start(self.loader)
        batches = self.loader
        if skip:
            batches = self.accelerator.skip_first_batches(self.loader, skip)
            if callable(getattr(batches, "set_epoch", None)):
                batches.set_epoch(self.epoch)  # a new loader: its own epoch count starts at 0
        iterator = iter(batches)
        with self.hooks.section():  # the first batch: workers starting, batches skipped
            batch = next(iterator, _END)
        if skip:
            self.hooks.reapply_rng()  # the checkpoint's step, as the fault-free run had it
        return iterator, batch

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        resumed = self.start_step > 0
        while self.step < self.max_steps:
            iterator, batch = self._begin_epoch(resumed)
            resumed = False
            finished = False
            while batch is not _END:
                yield self.step + 1, batch
                self.batch += 1
                if self.accelerator.sync_gradients:  # an optimizer step, not only accumulation
                    self.step += 1
                    self.hooks.step_done(self.step)
                    if self.step >= self.max_steps:
                        finished = True
                        break
                batch = next(iterator, _END)
            if finished:
                break
            self.epoch, self.batch = self.epoch + 1, 0
        self.hooks.training_done()  # the rest of main (an evaluation, a save) is not a hang

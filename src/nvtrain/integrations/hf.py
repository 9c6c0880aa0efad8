"""Hugging Face ``Trainer`` under the worker library: two lines in a training script.

    import nvtrain.integrations.hf as nvhf

    def main(ctx):
        trainer = Trainer(model=build_model(), args=training_args, train_dataset=data)
        nvhf.train(ctx, trainer)          # instead of trainer.train()

    if __name__ == "__main__":
        nvhf.run(main)                    # instead of main()

What ``train`` does to the trainer, for this call only:

- adds a callback: at ``on_train_begin`` (model wrapped, optimizer and scheduler made) it binds
  the checkpointer to the model, the optimizer, the scheduler, the grad scaler and the trainer's
  counters and restores the newest checkpoint; at ``on_step_end`` it calls ``ctx.step_done``
  (heartbeat, progress, async save when due, faults, events) and, unless
  ``keep_framework_saves``, cancels the Trainer's own synchronous save;
- resumes through the Trainer's own path, so that it skips the epochs and batches already
  trained exactly as it does for its own checkpoints: ``resume_from_checkpoint`` is a folder
  holding only a ``trainer_state.json`` at the checkpoint's step, and the Trainer's loaders of
  model, optimizer, scheduler and scaler files (``_load_from_checkpoint``,
  ``_load_optimizer_and_scheduler``, ``_load_scaler``) are replaced by no-ops for the call,
  ``_load_rng_state`` by setting the RNG states the restore set;
- runs the data-loader set-up, the batch skipping of a resume, evaluation and the Trainer's own
  saves in sections (not taken for hangs).

The checkpoint interval is the policy's ``[checkpoint] interval``; when the policy leaves it
unset, the Trainer's ``save_steps`` or a tenth of ``max_steps`` (``cadence``). Refused at the
first attempt (exit 2 under ``nvtrain run``, ``core.Refused``): ``resume_from_checkpoint=``,
DeepSpeed (its engine keeps the optimizer state), and a transformers whose private API differs
from the facts recorded for 5.17 to 5.25 (``private_api``).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import nvtrain.worker as nw
from nvtrain.integrations import private_api
from nvtrain.integrations.cadence import apply_cadence
from nvtrain.integrations.core import Hooks, IntegrationError, Refused, Stateful
from nvtrain.integrations.core import run as _run

__all__ = ["Callback", "run", "train"]

_transformers = importlib.import_module("transformers")

T = TypeVar("T")
_TrainerCallback: Any = _transformers.TrainerCallback

_LOADERS = ("_load_from_checkpoint", "_load_optimizer_and_scheduler", "_load_scaler", "_load_rng_state")
"""The Trainer's methods that read its own checkpoint files, replaced for the call."""

SECTIONS = ("get_train_dataloader", "get_resumed_dataloader", "evaluate", "_save_checkpoint", "save_model")
"""The Trainer's methods that run in a section: not training steps, and may take long."""

_COUNTERS = ("epoch", "total_flos", "num_input_tokens_seen", "best_metric", "best_global_step")
"""The ``TrainerState`` fields kept in the checkpoint besides ``global_step`` (its step)."""


def run(main: Callable[[nw.Context], T]) -> T:
    """``nvtrain.worker.run(main)``: ``main(ctx)`` under in-process restart. Every attempt
    starts with accelerate's process-wide state forgotten (the Trainer's accelerator is made
    again for the new process group)."""
    return _run(main, before_attempt=private_api.checked_reset_accelerate_state)


class Callback(_TrainerCallback):  # type: ignore[misc]
    """The Trainer callback ``train`` adds; its hooks call the worker library."""

    def __init__(self, hooks: Hooks, trainer: Any, *, keep_framework_saves: bool = False) -> None:
        self.hooks = hooks
        self.trainer = trainer
        self.keep_framework_saves = keep_framework_saves

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = self.trainer
        extra: dict[str, Any] = {
            "trainer": Stateful(lambda: _counters(state), lambda s: _set_counters(state, s))
        }
        if trainer.lr_scheduler is not None:
            extra["scheduler"] = trainer.lr_scheduler
        scaler = getattr(trainer.accelerator, "scaler", None)
        if scaler is not None:
            extra["scaler"] = scaler
        apply_cadence(
            self.hooks.ctx, own=_save_steps(args, state), own_name="save_steps", max_steps=state.max_steps
        )
        step = self.hooks.bind(trainer.model, trainer.optimizer, extra)
        if step != state.global_step:
            # The Trainer skipped its data for the newest committed step, and that checkpoint
            # turned out unusable (rejected now): the next attempt resumes from the one restored.
            raise IntegrationError(
                f"the Trainer was set to resume at step {state.global_step}, but the checkpoint "
                f"restored is step {step} (the newer one was rejected); restarting from step {step}"
            )
        if step > 0:  # the state came from our trainer_state.json: ratios become step counts
            state.compute_steps(args, state.max_steps)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.hooks.step_done(state.global_step)
        if not self.keep_framework_saves:
            control.should_save = False

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.keep_framework_saves:
            control.should_save = False


def _save_steps(args: Any, state: Any) -> int | None:
    """The Trainer's own cadence in steps: ``save_steps`` with ``save_strategy = "steps"`` (a
    ratio below 1 is that share of ``max_steps``, rounded up, as the Trainer takes it); None
    for another strategy. From the arguments, so that every attempt finds the same."""
    if str(getattr(args.save_strategy, "value", args.save_strategy)) != "steps" or not args.save_steps:
        return None
    steps = float(args.save_steps)
    if steps < 1:
        return math.ceil(state.max_steps * steps) if state.max_steps and state.max_steps > 0 else None
    return int(steps)


def _counters(state: Any) -> dict[str, Any]:
    """The counters as plain data (a metric may be a numpy or torch scalar: its ``item()``)."""
    counters = {}
    for name in _COUNTERS:
        value = getattr(state, name, None)
        if (
            value is not None
            and type(value) not in (int, float, bool)
            and callable(getattr(value, "item", None))
        ):
            value = value.item()
        counters[name] = value
    return counters


def _set_counters(state: Any, saved: dict[str, Any]) -> None:
    for name, value in saved.items():
        if name in _COUNTERS:
            setattr(state, name, value)


def train(ctx: nw.Context, trainer: Any, *, keep_framework_saves: bool = False, **kwargs: Any) -> Any:
    """``trainer.train(**kwargs)`` under the worker library; returns its ``TrainOutput``.

    Restores the newest checkpoint of the run, saves on the policy's ``[checkpoint]
    interval`` (async, host copy), and replaces the Trainer's own saves unless
    ``keep_framework_saves`` (then both are written, and the Trainer's block the loop)."""
    if kwargs.get("resume_from_checkpoint") not in (None, False):
        raise Refused(
            "train(ctx, trainer, resume_from_checkpoint=...): nvtrain restores the newest checkpoint "
            "of the run itself; drop resume_from_checkpoint"
        )
    kwargs.pop("resume_from_checkpoint", None)
    if getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer.args, "deepspeed", None):
        raise Refused(
            "train(ctx, trainer): the Trainer runs DeepSpeed, whose engine keeps the optimizer state "
            "that nvtrain's checkpoints hold; nvtrain.integrations.hf does not cover it: drop "
            "TrainingArguments(deepspeed=...), or run the script without the integration"
        )
    private_api.check("transformers", _transformers.__version__)
    missing = [name for name in _LOADERS if not callable(getattr(trainer, name, None))]
    if missing or not hasattr(trainer, "_train_batch_size"):
        raise Refused(
            f"this Trainer ({type(trainer).__qualname__}, transformers {_transformers.__version__}) has "
            f"no {', '.join(missing or ['_train_batch_size'])}, which nvtrain.integrations.hf uses to "
            f"resume; it supports {private_api.HF.span}"
        )
    hooks = Hooks(ctx)
    callback = Callback(hooks, trainer, keep_framework_saves=keep_framework_saves)
    trainer.add_callback(callback)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="nvtrain-hf-") as folder,
            hooks.sections(trainer, SECTIONS),
            _loaders_replaced(trainer, hooks),
        ):
            resume = _resume_folder(ctx, trainer, Path(folder))
            output = trainer.train(resume_from_checkpoint=resume, **kwargs)
        hooks.training_done()
        return output
    finally:
        trainer.remove_callback(callback)


def _resume_folder(ctx: nw.Context, trainer: Any, folder: Path) -> str | None:
    """A folder the Trainer resumes from: only ``trainer_state.json``, at the step of the
    newest committed checkpoint (None when there is none). The rest of the state is restored by
    the checkpointer in ``on_train_begin``."""
    steps = nw.committed_steps(ctx.run_dir)
    if not steps:
        return None
    args = trainer.args
    state = _transformers.TrainerState(
        global_step=steps[-1],
        logging_steps=args.logging_steps,
        eval_steps=args.eval_steps,
        save_steps=args.save_steps,
        train_batch_size=trainer._train_batch_size,
    )
    state.save_to_json(str(folder / "trainer_state.json"))  # the Trainer's TRAINER_STATE_NAME
    return str(folder)


@contextlib.contextmanager
def _loaders_replaced(trainer: Any, hooks: Hooks) -> Iterator[None]:
    def nothing(*_args: Any, **_kwargs: Any) -> None:
        return None

    def rng(_checkpoint: Any = None) -> None:
        hooks.reapply_rng()

    replacements: dict[str, Callable[..., None]] = dict.fromkeys(_LOADERS, nothing)
    replacements["_load_rng_state"] = rng
    for name, function in replacements.items():
        setattr(trainer, name, function)
    try:
        yield
    finally:
        for name in replacements:
            with contextlib.suppress(AttributeError):
                delattr(trainer, name)

"""Lightning under the worker library: two lines in a training script.

    import nvtrain.integrations.lightning as nvpl

    def main(ctx):
        trainer = L.Trainer(strategy="ddp", max_steps=1000, ...)
        nvpl.fit(ctx, trainer, model, train_dataloaders=loader)   # instead of trainer.fit(...)

    if __name__ == "__main__":
        nvpl.run(main)                                             # instead of main()

What ``fit`` does, for this call only:

- adds a callback: at ``on_fit_start`` (strategy set up: optimizer made, model wrapped) it
  binds the checkpointer to the LightningModule, its optimizer, the schedulers, the precision
  plugin's state and the fit loop's progress, and restores the newest checkpoint; the restored
  loops, schedulers and precision state go to Lightning's own restore (the one ``ckpt_path``
  uses), which sets the loops' counters as for its own checkpoints. At every
  ``on_train_batch_end`` that completed an optimizer step it calls ``ctx.step_done``
  (heartbeat, progress, async save when due, faults, events). Validation runs in a section.
- makes the training data loaders resumable (their class becomes a subclass with
  ``state_dict``/``load_state_dict``, so Lightning resumes mid-epoch): a restore skips the
  batches of the epoch already trained, then sets the RNG states the checkpoint held again.
- takes the ``ModelCheckpoint`` callbacks out (their synchronous saves), unless
  ``keep_framework_saves``.

The checkpoint interval is the policy's ``[checkpoint] interval``; when the policy leaves it
unset, a ``ModelCheckpoint``'s ``every_n_train_steps`` or a tenth of the run's steps
(``cadence``). One optimizer (automatic or manual optimization). Refused at the first attempt
(exit 2 under ``nvtrain run``, ``core.Refused``): ``ckpt_path=``, a strategy other than DDP or
a single device (DeepSpeed, FSDP, ...), and a Lightning whose private API differs from the
facts recorded for 2.6.0 to 2.6.6 (``private_api``).
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
    Refused,
    Stateful,
    epoch_start,
    replay_epoch_start,
)
from nvtrain.integrations.core import run as _run

__all__ = ["Callback", "fit", "resumable", "run"]


def _import_lightning() -> Any:
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:
        return importlib.import_module("pytorch_lightning")


_pl = _import_lightning()
_LightningCallback: Any = _pl.Callback

T = TypeVar("T")


def run(main: Callable[[nw.Context], T]) -> T:
    """``nvtrain.worker.run(main)``: ``main(ctx)`` under in-process restart."""
    return _run(main, before_attempt=private_api.checked_reset_accelerate_state)


# -- resumable data loaders ---------------------------------------------------------------


def _nothing() -> None:
    return None


def resumable(loader: Any, after_skip: Callable[[], None] | None = None) -> Any:
    """Make a torch ``DataLoader`` resumable in place: its class becomes a subclass with
    ``state_dict``/``load_state_dict`` (which Lightning keeps when it re-creates the loader with
    a distributed sampler); a resumed iteration skips the batches already trained, then calls
    ``after_skip``. Other objects are returned as they are. Returns ``loader``."""
    import torch

    if not isinstance(loader, torch.utils.data.DataLoader):
        return loader
    base = getattr(type(loader), "_nvtrain_base", type(loader))
    # The mixin's methods are copied, not inherited: a second base would change the instance
    # layout, and an instance's class can only be swapped for one of the same layout.
    attributes = {k: v for k, v in vars(_ResumableMixin).items() if k == "__iter__" or not k.startswith("__")}
    attributes.update(
        __module__=__name__, _nvtrain_base=base, _nvtrain_after_skip=staticmethod(after_skip or _nothing)
    )
    loader.__class__ = type(f"Resumable{base.__name__}", (base,), attributes)
    return loader


class _ResumableMixin:
    """What a resumable loader adds. Its position is written by the callback (the batches of
    the epoch that were trained, which Lightning's prefetching hides from the loader), with
    what decided the epoch's order (``core.epoch_start``, taken here when the epoch's iterator
    is made). A resume mid-epoch sets that again, makes the iterator, skips the batches trained
    and calls ``after_skip``; a resume at an epoch's end calls it before the next epoch."""

    _nvtrain_resumable = True
    _nvtrain_base: Any = None
    _nvtrain_after_skip: Callable[[], None] = _nothing
    _nvtrain_skip = 0
    _nvtrain_replay: dict[str, Any] | None = None
    _nvtrain_resumed = False
    _nvtrain_epoch_start: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"batches": 0, "of": 0, "epoch_start": self._nvtrain_epoch_start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        batches, of = int(state.get("batches", 0)), int(state.get("of", 0))
        self._nvtrain_skip = batches if 0 < batches < of else 0  # a full epoch: the next one starts
        self._nvtrain_replay = state.get("epoch_start") if self._nvtrain_skip else None
        self._nvtrain_resumed = True

    def __iter__(self) -> Any:
        skip, replay, resumed = self._nvtrain_skip, self._nvtrain_replay, self._nvtrain_resumed
        self._nvtrain_skip, self._nvtrain_replay, self._nvtrain_resumed = 0, None, False
        if skip and replay is not None:
            replay_epoch_start(self, replay)  # this epoch's order and seeds again
            self._nvtrain_epoch_start = replay
            return self._skipping(self._nvtrain_base.__iter__(self), skip)
        if resumed and not skip:  # at an epoch's end: the next one draws from the checkpoint's RNG
            self._nvtrain_after_skip()
        self._nvtrain_epoch_start = epoch_start(self)
        iterator = self._nvtrain_base.__iter__(self)
        return self._skipping(iterator, skip) if skip else iterator

    def _skipping(self, iterator: Any, skip: int) -> Iterator[Any]:
        """Lazily (the sampler's epoch is set after ``iter()``): skip, set the RNG, go on."""
        for _ in range(skip):
            next(iterator)
        self._nvtrain_after_skip()
        yield from iterator


def _stateful(loader: Any) -> bool:
    """What Lightning takes for a resumable loader (its ``_Stateful`` protocol)."""
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def _flattened(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flattened(v)]
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flattened(v)]
    return [value]


# -- the callback -------------------------------------------------------------------------


class Callback(_LightningCallback):  # type: ignore[misc]
    """The Lightning callback ``fit`` adds; its hooks call the worker library."""

    def __init__(self, hooks: Hooks, own_interval: int | None = None) -> None:
        self.hooks = hooks
        self.own_interval = own_interval
        """The smallest ``every_n_train_steps`` of the trainer's ``ModelCheckpoint`` callbacks."""
        self.position = (0, 0)
        """(batches of this epoch trained, batches per epoch) at the last step."""
        self.last_step = -1
        self.loaded: dict[str, Any] = {}
        self._section = contextlib.ExitStack()

    # restore ----------------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = list(trainer.optimizers)
        if len(optimizers) != 1:
            raise IntegrationError(
                f"the LightningModule's configure_optimizers() made {len(optimizers)} optimizers; "
                "nvtrain.integrations.lightning checkpoints exactly one: return one optimizer"
            )
        connector = trainer._checkpoint_connector  # checked by fit (private_api)
        apply_cadence(
            self.hooks.ctx,
            own=self.own_interval,
            own_name="ModelCheckpoint(every_n_train_steps)",
            max_steps=_max_steps(trainer),
        )
        extra = {
            "loops": Stateful(lambda: self._loops(trainer), self._keep("loops")),
            "schedulers": Stateful(
                lambda: {"states": [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs]},
                self._keep("schedulers"),
            ),
            "precision": Stateful(
                lambda: {"state": trainer.precision_plugin.state_dict()}, self._keep("precision")
            ),
        }
        step = self.hooks.bind(pl_module, optimizers[0], extra)
        self.last_step = step
        if step == 0:
            return
        # Lightning's own restore (the one ckpt_path takes) runs right after this hook: it sets
        # the loops' counters and restarting flags, the schedulers and the precision state.
        checkpoint: dict[str, Any] = {
            "epoch": self.loaded["loops"].get("epoch", 0),
            "global_step": step,
            "loops": {"fit_loop": self.loaded["loops"]["fit_loop"]},
            "lr_schedulers": self.loaded["schedulers"]["states"],
            "optimizer_states": [optimizer.state_dict() for optimizer in optimizers],
        }
        precision = self.loaded.get("precision", {}).get("state")
        if precision:
            checkpoint[type(trainer.precision_plugin).__qualname__] = precision
        connector._loaded_checkpoint = checkpoint

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.global_step != self.hooks.start_step:
            raise IntegrationError(
                f"Lightning resumed at step {trainer.global_step}, the checkpoint restored is step "
                f"{self.hooks.start_step}"
            )

    def _keep(self, key: str) -> Callable[[dict[str, Any]], None]:
        def keep(state: dict[str, Any]) -> None:
            self.loaded[key] = state

        return keep

    def _loops(self, trainer: Any) -> dict[str, Any]:
        """The fit loop's state as Lightning saves it, with the data position the callback
        knows for each resumable loader (another stateful loader keeps its own state)."""
        fit_loop = trainer.fit_loop
        state = fit_loop.state_dict()
        combined = getattr(fit_loop, "_combined_loader", None)
        batches, of = self.position
        # A resumable loader's own state holds what decided its epoch's order (a sampler that
        # draws its seed from the process's RNG, as a single device's RandomSampler does); the
        # position is the callback's.
        states = [
            loader.state_dict() | {"batches": batches, "of": of}
            if getattr(loader, "_nvtrain_resumable", False)
            else loader.state_dict()
            for loader in (_flattened(combined.flattened) if combined is not None else [])
            if _stateful(loader)
        ]
        own = dict(state.get("state_dict") or {})  # the loop's own: the loaders' states
        own.pop("combined_loader", None)
        if states:
            own["combined_loader"] = states
        state["state_dict"] = own
        return {"fit_loop": state, "epoch": trainer.current_epoch}

    # steps ------------------------------------------------------------------------------
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        per_epoch = trainer.num_training_batches  # inf for an iterable dataset: no mid-epoch skip
        self.position = (batch_idx + 1, int(per_epoch) if per_epoch != float("inf") else 0)
        step = int(trainer.global_step)
        if step > self.last_step:  # an optimizer step (not a batch that only accumulated)
            self.last_step = step
            self.hooks.step_done(step)

    # sections ---------------------------------------------------------------------------
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._section.close()
        self._section.enter_context(self.hooks.section())

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._section.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._section.close()

    def close(self) -> None:
        self._section.close()


def _max_steps(trainer: Any) -> int | None:
    """The run's optimizer steps: ``max_steps``, else Lightning's estimate from the epochs and
    the loader (None when it has none: an iterable dataset without a length)."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return int(trainer.max_steps)
    try:
        estimate = trainer.estimated_stepping_batches
    except Exception:  # noqa: BLE001 - any: no estimate, the default cadence then
        return None
    return int(estimate) if estimate not in (None, float("inf")) and estimate > 0 else None


def _own_interval(callbacks: list[Any]) -> int | None:
    """The smallest ``every_n_train_steps`` of the ``ModelCheckpoint`` callbacks (None: none
    saves by steps; Lightning's default one saves at each epoch's end)."""
    steps = [
        int(c._every_n_train_steps)
        for c in callbacks
        if isinstance(c, _pl.callbacks.ModelCheckpoint) and (getattr(c, "_every_n_train_steps", 0) or 0) > 0
    ]
    return min(steps) if steps else None


def _refuse_unsupported(trainer: Any, kwargs: dict[str, Any]) -> None:
    """The calls ``fit`` refuses (``core.Refused``: exit 2 at the first attempt)."""
    if kwargs.get("ckpt_path") is not None:
        raise Refused(
            "fit(ctx, trainer, model, ckpt_path=...): nvtrain restores the newest checkpoint of the "
            "run itself; drop ckpt_path"
        )
    strategies = _pl.strategies
    strategy = trainer.strategy
    if type(strategy) not in (strategies.DDPStrategy, strategies.SingleDeviceStrategy):
        raise Refused(
            f"fit(ctx, trainer, ...): the trainer's strategy is {type(strategy).__name__}; "
            "nvtrain.integrations.lightning covers DDP and a single device only (its checkpoints "
            "hold the module's and one optimizer's full state): use strategy=\"ddp\", or run the "
            "script without the integration"
        )
    private_api.check("lightning", str(_pl.__version__))


def fit(
    ctx: nw.Context,
    trainer: Any,
    model: Any,
    train_dataloaders: Any = None,
    val_dataloaders: Any = None,
    datamodule: Any = None,
    *,
    keep_framework_saves: bool = False,
    **kwargs: Any,
) -> None:
    """``trainer.fit(model, ...)`` under the worker library (see the module docstring)."""
    _refuse_unsupported(trainer, kwargs)
    kwargs.pop("ckpt_path", None)
    hooks = Hooks(ctx)
    for loader in _flattened(train_dataloaders):
        resumable(loader, hooks.reapply_rng)
    saved_callbacks = list(trainer.callbacks)
    callback = Callback(hooks, _own_interval(saved_callbacks))
    kept = [
        c for c in saved_callbacks if keep_framework_saves or not isinstance(c, _pl.callbacks.ModelCheckpoint)
    ]
    trainer.callbacks = [*kept, callback]
    source = datamodule if datamodule is not None else model
    try:
        with contextlib.ExitStack() as stack:
            if train_dataloaders is None and callable(getattr(source, "train_dataloader", None)):
                stack.enter_context(_resumable_from(source, hooks.reapply_rng))
            stack.enter_context(hooks.sections(trainer, ("save_checkpoint",)))
            stack.enter_context(hooks.sections(trainer.fit_loop, ("setup_data",)))
            trainer.fit(model, train_dataloaders, val_dataloaders, datamodule, **kwargs)
        hooks.training_done()  # (Lightning's teardown may have moved the model to the CPU)
    finally:
        callback.close()
        trainer.callbacks = saved_callbacks


@contextlib.contextmanager
def _resumable_from(source: Any, after_skip: Callable[[], None]) -> Iterator[None]:
    """``source.train_dataloader()`` returns resumable loaders while inside."""
    original = source.train_dataloader
    had_own = "train_dataloader" in vars(source)

    def train_dataloader() -> Any:
        loaders = original()
        for loader in _flattened(loaders):
            resumable(loader, after_skip)
        return loaders

    source.train_dataloader = train_dataloader
    try:
        yield
    finally:
        if had_own:
            source.train_dataloader = original
        else:
            with contextlib.suppress(AttributeError):
                del source.train_dataloader

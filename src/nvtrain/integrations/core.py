"""What the framework integrations share: one attempt's link between a framework's hooks and
the worker library's :class:`~nvtrain.worker.Context`.

A framework owns its loop; an integration only maps the loop's hooks onto the context:

======================  ==========================================================
framework hook          worker library
======================  ==========================================================
model and optimizer     ``Hooks.bind``: ``ctx.checkpointer(model, optimizer, extra)``,
ready                   restores the newest checkpoint (host copy, peer copy, storage)
optimizer step done     ``Hooks.step_done``: heartbeat, progress, async save when due,
                        faults, ``step`` events
evaluation, data-loader ``Hooks.section`` / ``Hooks.in_section``: not taken for a hang
set-up, a framework's
own save
the training function   ``run``: ``nvtrain.worker.run``, NVRx in-process restart
======================  ==========================================================

Nothing here knows a framework; each ``nvtrain.integrations.<framework>`` module imports its
own framework and nothing else does.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import nvtrain.worker as nw
from nvtrain.errors import NvtrainError
from nvtrain.worker import refusal

__all__ = [
    "Hooks",
    "IntegrationError",
    "Refused",
    "Stateful",
    "reset_accelerate_state",
    "epoch_start",
    "generators",
    "replay_epoch_start",
    "rng_state",
    "run",
    "set_rng_state",
    "unwrap_optimizer",
]

T = TypeVar("T")
_NONE = object()


class IntegrationError(NvtrainError):
    """A framework object the integration cannot work with (a version without a hook it needs,
    a state it cannot checkpoint); the message names the object, what was found and the fix."""


class Refused(IntegrationError):
    """A call the integration refuses (an argument nvtrain owns, a strategy or a framework
    version it was not built for): the script must change, and no retry can help. Under
    ``nvtrain run`` the attempt does not raise it into the in-process layer (which would retry
    it until its attempts ran out): the rank ends at once with exit 2 and the message
    (``run``), and the launcher ends the run with exit 2, the message in its cause."""


class Stateful:
    """``state_dict()``/``load_state_dict()`` over two functions, for a framework's state that
    has no such methods (a trainer's step counters): an ``extra`` the checkpointer can keep."""

    def __init__(self, get: Callable[[], dict[str, Any]], put: Callable[[dict[str, Any]], None]) -> None:
        self._get = get
        self._put = put

    def state_dict(self) -> dict[str, Any]:
        return self._get()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._put(state)


def rng_state() -> dict[str, Any]:
    """The process's RNG states (Python, torch, CUDA, numpy when imported), as plain data (a
    checkpoint's extra may hold it: numpy's state is kept as a dict of its integers)."""
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, has_gauss, gauss = numpy.random.get_state()
        state["numpy"] = {"kind": str(kind), "keys": [int(k) for k in keys], "pos": int(pos)}
        state["numpy"].update(has_gauss=int(has_gauss), gauss=float(gauss))
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Set the RNG states ``rng_state`` returned."""
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy = sys.modules.get("numpy")
    if "numpy" in state and numpy is not None:
        saved = state["numpy"]
        keys = numpy.array(saved["keys"], dtype=numpy.uint32)
        numpy.random.set_state((saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["gauss"]))


def generators(loader: Any) -> list[Any]:
    """The torch generators that decide the order of ``loader``'s batches (the loader's, its
    sampler's and, through accelerate's wrappers, the sampler they wrap), each once."""
    import torch

    found: list[Any] = []
    stack = [loader]
    seen: set[int] = set()
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Generator):
            found.append(obj)
            continue
        for name in ("synchronized_generator", "generator", "sampler", "batch_sampler", "base_dataloader"):
            stack.append(getattr(obj, name, None))
    return found


def epoch_start(loader: Any) -> dict[str, Any]:
    """What decides the order of an epoch of ``loader`` and the seeds its iterator draws, taken
    right before the iterator is made: the process's RNG states and the loader's generators
    (plain data). A resumed epoch sets them again, makes its iterator, skips the batches already
    trained, then sets the RNG states of the checkpoint's step (``Hooks.reapply_rng``)."""
    return {"rng": rng_state(), "generators": [g.get_state() for g in generators(loader)]}


def replay_epoch_start(loader: Any, start: dict[str, Any]) -> None:
    """Set what ``epoch_start`` took; an error naming the difference when the loader has
    another number of generators than the one that was saved."""
    found = generators(loader)
    if len(found) != len(start["generators"]):
        raise IntegrationError(
            f"the checkpoint holds {len(start['generators'])} data-order generator state(s), this "
            f"data loader has {len(found)}: build the data loader as the run that saved it did"
        )
    set_rng_state(start["rng"])
    for generator, state in zip(found, start["generators"], strict=True):
        generator.set_state(state)


def unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside a framework's wrapper (accelerate's ``AcceleratedOptimizer``
    keeps it in ``.optimizer``, Lightning's ``LightningOptimizer`` in ``._optimizer``): the
    checkpointer reads and loads the state of the optimizer that owns it."""
    import torch

    original, seen = optimizer, 0
    while not _is_plain_optimizer(optimizer, torch) and seen < 8:
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None:
            break
        optimizer, seen = inner, seen + 1
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise IntegrationError(
            f"the optimizer is a {type(original).__module__}.{type(original).__qualname__}, not a "
            "torch.optim.Optimizer (nor a wrapper of one in .optimizer or ._optimizer): the "
            "checkpointer cannot save it; use a torch optimizer"
        )
    return optimizer


def _is_plain_optimizer(optimizer: Any, torch: Any) -> bool:
    """A torch optimizer that is not a wrapper of another (accelerate's wrapper subclasses
    ``torch.optim.Optimizer`` too)."""
    inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
    return isinstance(optimizer, torch.optim.Optimizer) and not isinstance(inner, torch.optim.Optimizer)


class Hooks:
    """One training attempt's hooks, for the framework's callback to call.

    ``bind`` once the model and optimizer exist (it restores); ``step_done`` after every
    optimizer step; ``section`` (or ``in_section``) around stretches that are not steps;
    ``reapply_rng`` where a framework re-seeds after a restore (the RNG states are those the
    checkpoint held, as the restore set them)."""

    def __init__(self, ctx: nw.Context) -> None:
        self.ctx = ctx
        self.bound = False
        self.start_step = 0
        self._restored_rng: dict[str, Any] | None = None
        self._depth = 0

    def bind(self, model: Any, optimizer: Any, extra: dict[str, Any] | None = None) -> int:
        """Bind the checkpointer to ``model``, ``optimizer`` (unwrapped) and ``extra`` and
        restore the newest checkpoint; returns its step (0: none)."""
        if self.bound:
            raise IntegrationError("the checkpointer is bound once per attempt; bind() was called again")
        self.ctx.checkpointer(model, unwrap_optimizer(optimizer) if optimizer is not None else None, extra)
        self.bound = True
        self.start_step = self.ctx.start_step
        if self.start_step > 0:
            self._restored_rng = rng_state()
        return self.start_step

    def reapply_rng(self) -> None:
        """Set the RNG states the restore set again (a no-op when nothing was restored)."""
        if self._restored_rng is not None:
            set_rng_state(self._restored_rng)

    def step_done(self, step: int, **metrics: float) -> None:
        self.ctx.step_done(step, **metrics)

    def section(self, limit: float | None = None) -> contextlib.AbstractContextManager[None]:
        return self.ctx.section(limit)

    def training_done(self) -> None:
        """The framework's training returned: the rest of ``main`` is not taken for a hang."""
        self.ctx.training_done()

    def in_section(self, function: Callable[..., T]) -> Callable[..., T]:
        """``function`` run inside a section every time it is called."""

        @functools.wraps(function)
        def wrapped(*args: Any, **kwargs: Any) -> T:
            if self._depth:  # inside another wrapped method's section already (a save's save_model)
                return function(*args, **kwargs)
            self._depth += 1
            try:
                with self.ctx.section():
                    return function(*args, **kwargs)
            finally:
                self._depth -= 1

        return wrapped

    @contextlib.contextmanager
    def sections(self, owner: Any, names: tuple[str, ...]) -> Iterator[None]:
        """While inside: ``owner``'s methods ``names`` (those it has) run in sections."""
        own = vars(owner)
        replaced = {name: own.get(name, _NONE) for name in names if callable(getattr(owner, name, None))}
        for name in replaced:
            setattr(owner, name, self.in_section(getattr(owner, name)))
        try:
            yield
        finally:
            for name, before in replaced.items():
                if before is _NONE:
                    with contextlib.suppress(AttributeError):
                        delattr(owner, name)
                else:
                    setattr(owner, name, before)


def reset_accelerate_state() -> None:
    """Forget accelerate's process-wide state (``PartialState``, ``AcceleratorState``,
    ``GradientState`` are singletons): an in-process restart makes a new process group, and the
    next attempt's objects must not be handed the previous attempt's state. A no-op when
    accelerate was never imported."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return
    state.AcceleratorState._reset_state(reset_partial_state=True)
    state.GradientState._reset_state()


def run(main: Callable[[nw.Context], T], *, before_attempt: Callable[[], None] | None = None) -> T:
    """``nvtrain.worker.run(main)``, calling ``before_attempt()`` first in every attempt. A
    ``Refused`` call ends the rank at once under ``nvtrain run`` (``worker.refusal``); started
    without it (``python train.py``), it is raised as it is."""

    def attempt(ctx: nw.Context) -> T:
        try:
            if before_attempt is not None:
                before_attempt()
            return main(ctx)
        except Refused as exc:
            if not os.environ.get("NVTRAIN_POLICY"):  # no nvtrain run: nothing would retry it
                raise
            refusal.refuse(ctx.events, ctx.rank, str(exc))
            raise AssertionError("not reached") from exc

    return nw.run(attempt)  # type: ignore[no-any-return]

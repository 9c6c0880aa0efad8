"""What the training function gets: ranks, the step loop's hooks, and the checkpointer."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from nvtrain.config.schema import Policy
from nvtrain.events import EventLog
from nvtrain.events.records import ObjectReused, Step
from nvtrain.nvrx import inprocess as nvrx_inprocess
from nvtrain.worker.checkpoint import Checkpointer, committed_steps
from nvtrain.worker.faults import FaultInjector
from nvtrain.worker.heartbeat import KEEP_ALIVE_FALLBACK, Heartbeat
from nvtrain.worker.settings import say

__all__ = ["Context", "KeptStateLost"]

_STEP_SAMPLE = 10
"""Step timings are written to the events log every this many steps (and every saved step)."""

TIMEOUTS_AFTER_STEPS = 8
"""With no ``[heartbeat] timeout`` in the policy, NVRx computes the heartbeat timeouts at the
first step of an attempt past this many steps and past its first checkpoint save (if a
checkpointer is bound): the intervals seen by then include the slow first steps and a save."""

T = TypeVar("T")

_KEPT: dict[tuple[str, str], tuple[tuple[int, int], Any]] = {}
"""Objects kept by ``Context.reuse`` per (run directory, key), with the (rank, world size) of
the attempt that built them; they live as long as the process (in-process restarts)."""


def pause_limit(policy: Policy) -> float:
    """How long a paused stretch (a checkpoint save or restore, ``Context.section``) keeps the
    heartbeats alive: the longer of ``[heartbeat] initial_timeout`` and ``timeout``, each taken
    as ``KEEP_ALIVE_FALLBACK`` (20 minutes) when unset."""
    hb = policy.heartbeat
    return max(
        KEEP_ALIVE_FALLBACK if hb.initial_timeout is None else hb.initial_timeout,
        KEEP_ALIVE_FALLBACK if hb.timeout is None else hb.timeout,
    )


class KeptStateLost(RuntimeError):
    """An object kept from the previous attempt could not be brought back to a checkpoint (none
    could be restored): it is dropped, and the next attempt builds it afresh."""


class Context:
    """One training attempt's view of the run. Created by ``nvtrain.worker.run``."""

    def __init__(
        self,
        *,
        policy: Policy,
        run_id: str,
        run_dir: Path,
        events: EventLog | None,
        heartbeat: Heartbeat,
        faults: FaultInjector,
        iteration: int,
        call_wrapper: Any = None,
    ) -> None:
        self.policy = policy
        self.run_id = run_id
        self.run_dir = run_dir
        self.events = events
        self.heartbeat = heartbeat
        self.faults = faults
        self.iteration = iteration
        """In-process restart attempt (0 on a fresh process)."""
        self.restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        """In-job restarts so far (ft_launcher)."""
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = (
            torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")
        )
        self.start_step = 0
        """Last step of the restored checkpoint: the loop continues at ``start_step + 1``."""
        self._call_wrapper = call_wrapper
        self._checkpointer: Checkpointer | None = None
        self._last_step_time: float | None = None
        self._last_step: tuple[int, float, float | None] | None = None
        """(step, wall time, seconds it took) of the last completed step."""
        self._last_logged: int | None = None
        # The main thread (leaving an attempt) and NVRx's abort thread both log the last step.
        self._log_lock = threading.Lock()
        self._reused: list[str] = []
        self._steps = 0
        """Steps completed in this attempt."""
        self._saved = False
        """A checkpoint was saved in this attempt."""
        self._timeouts_pending = heartbeat.enabled and policy.heartbeat.timeout is None
        """NVRx is still to compute the heartbeat timeouts in this attempt."""
        self._after_training: contextlib.ExitStack | None = None
        """The section from ``training_done`` to the attempt's end (None: not in one)."""

    def checkpointer(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Checkpointer:
        """Bind the checkpointer to ``model`` and ``optimizer`` (plus objects with
        ``state_dict``/``load_state_dict``, e.g. a data loader) and restore the newest
        checkpoint of this run. Sets and returns ``start_step`` through ``ctx.start_step``."""
        if self._checkpointer is not None:
            raise RuntimeError("checkpointer() is called once per attempt")
        self._checkpointer = Checkpointer(
            model=model,
            optimizer=optimizer,
            run_dir=self.run_dir,
            policy=self.policy.checkpoint,
            events=self.events,
            extra=extra,
            pause=self.section,
            pause_limit=pause_limit(self.policy),
            run_id=self.run_id,
            write_threads=self.policy.checkpoint.write_threads,
        )
        self.start_step = self._checkpointer.restore()
        self.heartbeat.beat()
        if self._reused and self.start_step == 0:
            for key in self._reused:
                _KEPT.pop((str(self.run_dir), key), None)
            raise KeptStateLost(
                f"no checkpoint could be restored into {', '.join(self._reused)} kept from the "
                "previous attempt; the next attempt builds them again"
            )
        return self._checkpointer

    def reuse(self, key: str, build: Callable[[], T]) -> T:
        """``build()`` once per process: a later in-process attempt of the same rank and world
        size gets the same object back instead of building it again, when a checkpoint exists to
        restore into it (the model and optimizer of a large job take seconds to build; the
        restore overwrites their state). Keep only what holds no process group: a module wrapped
        by FSDP or DDP holds the group of the attempt that built it, which the restart destroyed
        (the demo keeps its model only in a world of one). If the restore then finds nothing,
        ``checkpointer()`` drops the kept objects and raises :class:`KeptStateLost`, and the next
        attempt builds them afresh."""
        slot = (str(self.run_dir), key)
        shape = (self.rank, self.world_size)
        kept = _KEPT.get(slot)
        if kept is not None and kept[0] == shape and self.restorable:
            self._reused.append(key)
            if self.events is not None:
                self.events.emit(ObjectReused(rank=self.rank, key=key, iteration=self.iteration))
            return kept[1]  # type: ignore[no-any-return]
        value = build()
        _KEPT[slot] = (shape, value)
        return value

    @property
    def restorable(self) -> bool:
        """This run has a committed checkpoint, so ``checkpointer()`` will (normally) overwrite
        the model's and optimizer's state: a script may build the model without initialising it
        (on the meta device, then ``to_empty``) and save that time on every restart. If the
        restore finds nothing usable after all, ``start_step`` is 0 and the script initialises
        the model then."""
        return bool(committed_steps(self.run_dir))

    def step_done(self, step: int, **metrics: float) -> None:
        """Call after every optimizer step: heartbeat, progress, checkpoint when due, faults."""
        now = time.monotonic()
        self.end_section_after_training()  # (training went on after all)
        self.heartbeat.step()
        self._steps += 1
        if self._timeouts_pending and self._steps >= TIMEOUTS_AFTER_STEPS:
            if self._checkpointer is None or self._saved:
                self._calculate_timeouts()
        if self._call_wrapper is not None:
            self._call_wrapper.ping()
        saving = self._checkpointer is not None and self._checkpointer.due(step)
        first = self._last_step_time is None  # the first step of an attempt ends a recovery
        took = None if self._last_step_time is None else round(now - self._last_step_time, 6)
        if self.events is not None and (step % _STEP_SAMPLE == 0 or saving or first):
            self.events.emit(
                Step(
                    step=step,
                    rank=self.rank,
                    step_s=took,
                    attempt=self.iteration,
                    restart_count=self.restart_count,
                    extra=metrics,
                )
            )
            self._last_logged = step
        self._last_step_time = now
        self._last_step = (step, time.time(), took)
        if self._checkpointer is not None:
            if self._call_wrapper is not None and saving:
                with self._call_wrapper.atomic():
                    self._saved |= self._checkpointer.maybe_save(step)
            else:
                self._saved |= self._checkpointer.maybe_save(step)
        self.faults.maybe_fire(step, self.rank)

    def _calculate_timeouts(self) -> None:
        """NVRx computes the heartbeat timeouts (every rank calls this at the same step: a
        collective). A failure leaves hang detection as it was; it never stops training."""
        try:
            done = self.heartbeat.calculate_timeouts(
                self.policy.heartbeat.initial_timeout, self._timeout_floor()
            )
        except Exception as exc:  # noqa: BLE001 - never stops training: hang detection stays as it was
            self._timeouts_pending = False  # once: a collective cannot be retried by some ranks
            if self.rank == 0 or not dist.is_initialized():
                say(
                    f"NVRx could not compute the heartbeat timeouts ({exc!r}); hangs are not "
                    "detected by heartbeats: set [heartbeat] timeout in the policy"
                )
            return
        self._timeouts_pending = not done

    def _timeout_floor(self) -> float:
        """The least heartbeat timeout NVRx may compute here. NVRx sees only the gaps between
        heartbeats so far; an in-process restart (no heartbeats while the ranks tear down and
        meet again) it has not seen. With that layer on, the heartbeat timeout stays above
        its hard timeout, as a policy's fixed timeout must (1.5x, as the derived defaults),
        so the in-process layer acts first."""
        in_process = self.policy.restart.in_process
        return 1.5 * in_process.hard_timeout if in_process.enabled else 0.0

    def finish(self) -> None:
        """Log the last step, and wait for the last checkpoint to be committed."""
        self.log_last_step()
        if self._checkpointer is None:
            return
        if self._call_wrapper is not None:  # waiting for the last write is not a hang
            with self._call_wrapper.atomic():
                self._checkpointer.close()
        else:
            self._checkpointer.close()

    def training_done(self) -> None:
        """The training loop has ended; what ``main`` does after it (an evaluation, an export, a
        framework's own end of training, which may move the model off the GPU) is not a hang.
        Logs the last step and runs the rest of the attempt in a section (``section``, for up to
        its limit): steps no longer coming are not taken for a hang, which would run ``main``
        once more. The integrations call it when the framework's training returns; a script of
        its own calls it after its loop. The next ``step_done`` or the attempt's end closes it."""
        self.log_last_step()
        if self._after_training is None:
            stack = contextlib.ExitStack()
            stack.enter_context(self.section())
            self._after_training = stack

    def end_section_after_training(self) -> None:
        """Close the section ``training_done`` opened (a no-op when none is open)."""
        stack, self._after_training = self._after_training, None
        if stack is not None:
            stack.close()

    def log_last_step(self) -> None:
        """At the end of an attempt (a fault, or the end of training): log the last completed
        step if sampling skipped it, stamped with the time it completed, so the report counts
        exactly the steps that were run (and those a restart rolls back). Logs each step once,
        whichever thread comes first."""
        with self._log_lock:
            last = self._last_step
            if self.events is None or last is None or last[0] == self._last_logged:
                return
            step, wall, took = last
            self.events.emit(
                Step(
                    ts=round(wall, 6),
                    step=step,
                    rank=self.rank,
                    step_s=took if took is not None else 0.0,
                    attempt=self.iteration,
                    restart_count=self.restart_count,
                    unsampled=True,
                )
            )
            self._last_logged = step

    @contextlib.contextmanager
    def section(self, limit: float | None = None) -> Iterator[None]:
        """Run a long stretch that is not a training step (evaluation, a slow data-loader
        rebuild) without being taken for a hang: heartbeats and NVRx's progress are kept alive
        from a thread for at most ``limit`` seconds (default: :func:`pause_limit`); past that,
        a hang inside is caught as usual. Checkpoint saves and restores run in one."""
        limit = pause_limit(self.policy) if limit is None else limit
        with self.heartbeat.paused(limit), self._progress_kept(limit):
            yield

    @contextlib.contextmanager
    def _progress_kept(self, limit: float) -> Iterator[None]:
        """Keep NVRx's in-process soft and hard timeouts from firing for at most ``limit``
        seconds: they are shorter than a large save or an evaluation.

        NVRx judges progress by two timestamps: the manual one (``ping``, sent by
        ``step_done``) and an automatic one that only advances while the main thread runs
        Python code. A thread here pings for the first, which covers stretches of Python code
        (an evaluation loop). On NVRx 0.6+ the timeouts are also switched off for the stretch
        (``nvrx.inprocess.hang_switch``, back on at ``limit`` or at the end), which
        covers one long call into C as well (a first save pinning its host buffers). On 0.4.1
        there is no such switch: a single call longer than the soft timeout still counts as a
        hang there (docs/worker.md)."""
        wrapper = self._call_wrapper
        if wrapper is None:
            yield
            return
        switch = nvrx_inprocess.hang_switch(wrapper)
        wrapper.ping()
        if switch is not None:
            switch[0]()
        done = threading.Event()
        every = max(0.05, self.policy.restart.in_process.soft_timeout / 4)
        enabled = threading.Lock()  # whoever switches the timeouts back on does it once

        def back_on() -> None:
            if switch is not None and enabled.acquire(blocking=False):
                with contextlib.suppress(Exception):
                    switch[1]()

        def keep() -> None:
            waited = 0.0
            while waited < limit and not done.wait(min(every, limit - waited)):
                waited += every
                with contextlib.suppress(Exception):
                    wrapper.ping()
            back_on()  # past the limit a hang inside the stretch is caught again

        thread = threading.Thread(target=keep, name="nvtrain-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            back_on()
            with contextlib.suppress(Exception):
                wrapper.ping()

    def settle(self, limit: float) -> None:
        """Before an in-process restart: let the save in flight finish, for up to ``limit`` s."""
        if self._checkpointer is not None:
            self._checkpointer.settle(limit)

    def abort(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.abort()

"""What the training function gets: ranks, the step loop's hooks, and the checkpointer."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nvtrain.config.schema import Policy
from nvtrain.events import EventLog
from nvtrain.worker.checkpoint import Checkpointer
from nvtrain.worker.faults import FaultInjector
from nvtrain.worker.heartbeat import Heartbeat

__all__ = ["Context"]

_STEP_SAMPLE = 10
"""Step timings are written to the events log every this many steps (and every saved step)."""


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
        hb = self.policy.heartbeat
        self._checkpointer = Checkpointer(
            model=model,
            optimizer=optimizer,
            run_dir=self.run_dir,
            policy=self.policy.checkpoint,
            events=self.events,
            extra=extra,
            pause=self.heartbeat.paused,
            pause_limit=max(hb.initial_timeout, hb.timeout),
        )
        self.start_step = self._checkpointer.restore()
        self.heartbeat.beat()
        return self._checkpointer

    def step_done(self, step: int, **metrics: float) -> None:
        """Call after every optimizer step: heartbeat, progress, checkpoint when due, faults."""
        now = time.monotonic()
        self.heartbeat.step()
        if self._call_wrapper is not None:
            self._call_wrapper.ping()
        saving = self._checkpointer is not None and self._checkpointer.due(step)
        first = self._last_step_time is None  # the first step of an attempt ends a recovery
        took = None if self._last_step_time is None else round(now - self._last_step_time, 6)
        if self.events is not None and (step % _STEP_SAMPLE == 0 or saving or first):
            self.events.emit(
                "step",
                step=step,
                rank=self.rank,
                step_s=took,
                attempt=self.iteration,
                restart_count=self.restart_count,
                **metrics,
            )
            self._last_logged = step
        self._last_step_time = now
        self._last_step = (step, time.time(), took)
        if self._checkpointer is not None:
            if self._call_wrapper is not None and saving:
                with self._call_wrapper.atomic():
                    self._checkpointer.maybe_save(step)
            else:
                self._checkpointer.maybe_save(step)
        self.faults.maybe_fire(step, self.rank)

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

    def log_last_step(self) -> None:
        """At the end of an attempt (a fault, or the end of training): log the last completed
        step if sampling skipped it, stamped with the time it completed, so the report counts
        exactly the steps that were run (and those a restart rolls back)."""
        if self.events is None or self._last_step is None or self._last_step[0] == self._last_logged:
            return
        step, wall, took = self._last_step
        self.events.emit(
            "step",
            ts=round(wall, 6),
            step=step,
            rank=self.rank,
            step_s=took if took is not None else 0.0,
            attempt=self.iteration,
            restart_count=self.restart_count,
            unsampled=True,
        )
        self._last_logged = step

    def settle(self, limit: float) -> None:
        """Before an in-process restart: let the save in flight finish, for up to ``limit`` s."""
        if self._checkpointer is not None:
            self._checkpointer.settle(limit)

    def abort(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.abort()

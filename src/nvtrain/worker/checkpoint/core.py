"""What saving and restoring share: one attempt's checkpointer state and its small helpers.

Owns the construction of a checkpointer (its ranks and group, the host copy in files and the
copies on another pod when the policy and the pod allow them), the record of a save in flight
(``_Save``), the live state (model, optimizer, extras) as a state dict, events, pausing the
progress watchdog, and moving a damaged folder aside with its event. ``save`` and ``restore``
build on this; the ``Checkpointer`` facade (the package) joins them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict

from nvtrain.config.schema import Checkpoint as CheckpointPolicy
from nvtrain.events import Event, EventLog
from nvtrain.events.records import CheckpointRejected
from nvtrain.worker.checkpoint import layout
from nvtrain.worker.checkpoint.agreement import Ranks
from nvtrain.worker.checkpoint.failures import quiet_writer_threads
from nvtrain.worker.checkpoint.staging import Held, rng_state
from nvtrain.worker.hostcopy import ENV as HOST_COPY_ENV
from nvtrain.worker.hostcopy import HostCopy, host_copy, usable
from nvtrain.worker.peercopy import PeerCopies
from nvtrain.worker.peercopy import enabled as peer_copies_possible
from nvtrain.worker.plain import check_plain
from nvtrain.worker.settings import say

__all__ = ["CheckpointerCore"]

_SAID: set[str] = set()
"""Lines said once per process (not once per in-process attempt)."""


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        say(message)


class _Save:
    """One save in flight."""

    def __init__(
        self,
        step: int,
        folder: Path,
        future: concurrent.futures.Future[Any] | None,
        held: Held | None = None,
        *,
        error: BaseException | None = None,
        io_errors: list[OSError] | None = None,
        inline: bool = False,
        token: str = "",
    ):
        self.held = held
        self.token = token
        """Names this save: written into COMMITTED, and into the header of its host copy."""
        self.host_slot: Any = None
        """(slot, generation) of the host copy staged for this save."""
        self.io_errors = io_errors if io_errors is not None else []
        """Storage errors torch met writing this rank's shards (see ``WatchedFileSystem``)."""
        self.step = step
        self.folder = folder
        self.future = future
        self.inline = inline
        """A sync save: rank 0 commits in ``wait``, once every rank's part is known to be written."""
        self.written = threading.Event()
        """This rank's files and manifest are written, or failed (``error``)."""
        self.cancelled = False
        """Another rank's part failed: rank 0 stops waiting for its manifest, commits nothing."""
        self.committed = threading.Event()
        """Rank 0 has put it in place, or it failed (or this rank commits nothing): what a soft
        fault's ``settle`` waits for. ``done`` follows once the retention after it has run."""
        self.done = threading.Event()
        self.error = error
        self.started = time.monotonic()
        self.settling = False
        self.settled = threading.Event()
        self.sealed = threading.Event()
        """The header of this save's host copy is written (or will not be): set before
        ``written``."""


class CheckpointerCore:
    """The state of one attempt's checkpointer; see the ``Checkpointer`` facade."""

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        run_dir: Path,
        policy: CheckpointPolicy,
        events: EventLog | None = None,
        extra: dict[str, Any] | None = None,
        pause: Callable[[float], contextlib.AbstractContextManager[None]] | None = None,
        pause_limit: float = 3600.0,
        run_id: str | None = None,
        host_copy_dir: str | None = None,
        write_threads: int = 1,
    ) -> None:
        """``host_copy_dir`` (default: ``$NVTRAIN_HOST_COPY_DIR``, set by ``nvtrain run``) keeps
        the staged copy in files there, so that a replacement process restores from memory."""
        self.model = model
        self.write_threads = write_threads
        if write_threads > 1:
            quiet_writer_threads()
        """Threads (and files) per rank that torch's writer writes the shards with."""
        self.optimizer = optimizer
        self.run_dir = run_dir
        self.policy = policy
        self.events = events
        self.extra = extra or {}
        self._pause = pause
        self.pause_limit = pause_limit
        # Background saves coordinate on their own group, never on the training loop's.
        self.ranks = Ranks.join()
        self.inflight: _Save | None = None
        self._settle_lock = threading.Lock()
        self.aborted = False
        self.stager: Any = None
        self.last_saved: int | None = None
        self.newest_committed: int | None = None
        """The newest checkpoint this attempt restored or committed."""
        self.failed_in_a_row = 0
        """Saves dropped in a row (storage errors); 0 after a commit."""
        self.prepared = False
        """The next save's buffers are prepared (or being prepared) in the background."""
        self.memory_problem: str | None = None
        """Why the restore did not use the host copy (when there is one to use)."""
        folder = os.environ.get(HOST_COPY_ENV) if host_copy_dir is None else host_copy_dir
        self.host: HostCopy | None = None
        key: bytes | None = None
        if folder and policy.async_ and policy.in_memory:
            key, why = usable(Path(folder))
            if key is None:
                _say_once(
                    f"no host copy in {folder}: {why}; saves stage into this process's memory, and "
                    "a replaced worker restores from storage"
                )
            else:
                self.host = host_copy(
                    Path(folder), run_id=run_id or run_dir.name, rank=self.rank, world=self.world, key=key
                )
                if self.host.broken:  # said once, when it broke
                    self.host = None
        # The copies on another pod: decided alike on every rank (the same policy, world and
        # pod size), whether or not this rank's own copy works, since each exchange takes both.
        per_pod = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
        self.peers: PeerCopies | None = None
        if (
            folder
            and policy.async_
            and policy.in_memory
            and policy.peer_copy
            and self.distributed
            and peer_copies_possible(self.world, per_pod)
        ):
            self.peers = PeerCopies(
                Path(folder),
                key=key,
                run_id=run_id or run_dir.name,
                rank=self.rank,
                world=self.world,
                per_pod=per_pod,
                group=PeerCopies.new_group(),
                emit=self._emit,
            )

    # -- this rank's place ---------------------------------------------------------------------
    @property
    def distributed(self) -> bool:
        return self.ranks.distributed

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world(self) -> int:
        return self.ranks.world

    @property
    def group(self) -> Any:
        """The checkpoint's own gloo group (None when not distributed)."""
        return self.ranks.group

    # -- helpers ---------------------------------------------------------------------------
    def _emit(self, event: Event) -> None:
        if self.events is not None:
            self.events.emit(dataclasses.replace(event, rank=self.rank))

    @contextlib.contextmanager
    def _paused(self) -> Iterator[None]:
        if self._pause is None:
            yield
        else:
            with self._pause(self.pause_limit):
                yield

    def _state(self) -> dict[str, Any]:
        if self.optimizer is not None:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            return {"model": model_sd, "optim": optim_sd}
        model_sd, _ = get_state_dict(self.model, [])
        return {"model": model_sd}

    def _extra_state(self, step: int) -> dict[str, Any]:
        """The per-rank state besides the model's; ``ExtraNotPlain`` when an extra holds
        something a restore could not read back as plain data."""
        extras = {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in self.extra.items()}
        for key, value in extras.items():
            check_plain(str(key), value)
        return {"step": step, "world": self.world, "rng": rng_state(), "extra": extras}

    def _reject(self, folder: Path, step: int, problem: str) -> None:
        """Rank 0: move a damaged step folder aside, so it is never restored, kept as a commit
        or counted by retention (``retain`` deletes it once a later step is committed); one
        line says what was wrong."""
        try:
            aside = layout.move_aside(folder)
        except OSError as exc:  # a read-only volume: restore skips it all the same
            error = layout.os_error_text(exc)
            event = CheckpointRejected(step=step, path=str(folder), problem=problem, error=error)
        else:
            event = CheckpointRejected(step=step, path=str(folder), moved_to=str(aside), problem=problem)
        self._emit(event)
        say(f"checkpoint rejected: {event.text}")

"""What the workers log of checkpoints: each save's begin, staging, commit and replication,
restores, and the damaged or failed ones."""

from __future__ import annotations

import dataclasses

from nvtrain.events.base import Event, event_type

__all__ = [
    "CheckpointAlreadyCommitted",
    "CheckpointBegin",
    "CheckpointCommitted",
    "CheckpointCorrupt",
    "CheckpointFailed",
    "CheckpointPartial",
    "CheckpointRejected",
    "CheckpointReplicated",
    "CheckpointRestored",
    "CheckpointSettled",
    "CheckpointStaged",
]


@event_type("checkpoint_begin")
class CheckpointBegin(Event):
    step: int | None = None
    waited_for_previous_s: float | None = None


@event_type("checkpoint_staged")
class CheckpointStaged(Event):
    """A save's copy is taken: the training loop goes on (``blocked_s`` is what it waited)."""

    step: int | None = None
    blocked_s: float | None = None
    stage_s: float | None = None
    write_s: float | None = None
    """Sync saves only: the write, inside ``blocked_s``."""
    bytes: int | None = None
    is_async: bool | None = dataclasses.field(default=None, metadata={"key": "async"})


@event_type("checkpoint_committed")
class CheckpointCommitted(Event):
    step: int | None = None
    write_s: float | None = None
    bytes: int | None = None


@event_type("checkpoint_already_committed")
class CheckpointAlreadyCommitted(Event):
    """The step's checkpoint was already on storage, verified (an earlier attempt saved it)."""

    step: int | None = None
    path: str | None = None


@event_type("checkpoint_settled")
class CheckpointSettled(Event):
    """A save in flight at a fault was finished or dropped."""

    step: int | None = None
    waited_s: float | None = None
    finished: bool | None = None
    limit_s: float | None = None


@event_type("checkpoint_replicated")
class CheckpointReplicated(Event):
    """A rank's host copy of ``step`` was sent to the rank that keeps it on another pod (and that
    pod's copy of another rank received), in the background after the save."""

    step: int | None = None
    to_rank: int | None = None
    from_rank: int | None = None
    sent_bytes: int | None = None
    received_bytes: int | None = None
    seconds: float | None = None
    error: str | None = None
    """Why the exchange failed (the peer copies of this attempt are then off)."""


@event_type("checkpoint_restored")
class CheckpointRestored(Event):
    step: int | None = None
    origin: str | None = None
    """``storage``, ``memory`` (this pod's host copy) or ``peer`` (the copy another pod kept)."""
    seconds: float | None = None
    bytes: int | None = None
    memory_problem: str | None = None
    """Why a storage restore did not use the host copy that ``nvtrain run`` keeps in memory."""

    @property
    def from_storage(self) -> bool:
        # Logs before ``origin`` named it ``source`` (which the writer's common field now is).
        return self.origin == "storage" or (self.origin is None and self.source == "storage")


@event_type("checkpoint_partial")
class CheckpointPartial(Event):
    step: int | None = None
    path: str | None = None


@event_type("checkpoint_corrupt")
class CheckpointCorrupt(Event):
    step: int | None = None
    path: str | None = None
    problem: str | None = None


@event_type("checkpoint_rejected")
class CheckpointRejected(Event):
    """A step folder found damaged or forged, moved aside (``moved_to``) so it is never used."""

    step: int | None = None
    path: str | None = None
    moved_to: str | None = None
    problem: str | None = None
    """What was wrong, naming the file: ``extra-rank1.pt does not match its manifest's digest
    (found by rank 1)``, ``the .metadata names a class that is not allowed: posix.system``."""
    error: str | None = None
    """Why it could not be moved aside (a read-only volume); it is skipped all the same."""

    @property
    def text(self) -> str:
        """The event in one line: ``step 120: <problem>; moved to <path>``."""
        where = f"moved to {self.moved_to}" if self.moved_to else f"left in place ({self.error})"
        return f"step {self.step}: {self.problem or 'no reason given'}; {where}"


@event_type("checkpoint_failed")
class CheckpointFailed(Event):
    step: int | None = None
    error: str | None = None
    errno: str | None = None
    """The error's errno name (``ENOSPC``), when it has one."""
    ranks: tuple[int, ...] | None = None
    path: str | None = None
    failed_in_a_row: int | None = None

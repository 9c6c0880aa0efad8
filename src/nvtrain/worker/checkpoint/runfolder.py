"""Whether a save may still write into the run's folder: the checks ``save`` makes before it
writes a checkpoint, before each rank's manifest and before rank 0's commit (issue 51: a folder
above that another user could swap, or a run folder renamed or replaced mid-run). torch writes
the shards by path, so the path must still lead to the folder the run made, through folders
that no other user can change; otherwise the save is refused, never followed
(docs/security.md)."""

from __future__ import annotations

import os
from pathlib import Path

from nvtrain import private

__all__ = ["check_run_dir"]


def check_run_dir(run_dir: Path, seen: tuple[int, int] | None) -> tuple[int, int] | None:
    """Before a save writes into ``run_dir``: it must be a real folder of this user's, in folders
    safe from ``/`` down (``private.unsafe_ancestor``), and the folder seen before (``seen``:
    its ``(st_dev, st_ino)``), not one put in its place. Returns what to pass next time (None
    while the folder is not made yet); raises ``private.NotPrivate`` (an ``OSError``) saying why."""
    unsafe = private.unsafe_ancestor(run_dir)
    if unsafe is not None:
        raise unsafe
    try:
        info = os.stat(run_dir)
    except FileNotFoundError:
        if seen is not None:
            raise private.NotPrivate(run_dir, "is gone (removed or renamed away): nothing is saved") from None
        return None
    if not os.path.isdir(run_dir) or info.st_uid != os.geteuid():
        raise private.NotPrivate(run_dir, "is not a folder of this user's: nothing is saved there")
    if seen is not None and (info.st_dev, info.st_ino) != seen:
        raise private.NotPrivate(
            run_dir, "is not the folder this run saved into before (renamed or replaced): nothing is saved"
        )
    return info.st_dev, info.st_ino

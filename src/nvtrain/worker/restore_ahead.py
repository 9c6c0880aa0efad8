"""A replacement worker's restore, readied at its start: when this pod's host-copy folder holds a
copy of the worker's rank (a worker of that rank was replaced), the page-locked buffers the
restore will read through are made in the background (``hoststaging.warm``) while the worker
joins the process group and builds its model."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import torch

from nvtrain.worker import hoststaging
from nvtrain.worker.hostcopy import ENV, header_paths
from nvtrain.worker.hostread import CHUNK, read_private, threads

__all__ = ["sealed_bytes", "warm_restore"]


def sealed_bytes(folder: Path, rank: int) -> int | None:
    """The size of the largest copy of ``rank``'s that ``folder`` holds a header of (None when
    none). The headers are only read for their size (plain JSON of a private file of this
    user's); ``find`` checks a copy itself before it is used."""
    sizes = []
    for path in header_paths(folder, rank):
        try:
            header = json.loads(read_private(path))
        except (OSError, ValueError):  # (Rejected is a ValueError)
            continue
        size = header.get("bytes") if isinstance(header, dict) else None
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            sizes.append(size)
    return max(sizes, default=None)


def warm_restore(rank: int) -> threading.Event | None:
    """In a worker that starts on a GPU: when this pod's folder (``$NVTRAIN_HOST_COPY_DIR``)
    holds a copy of ``rank``'s (a worker of this rank was replaced), start making the
    page-locked buffers its restore will read through (``hoststaging.warm``) while the worker
    joins the process group and builds its model. None when there is nothing to restore here."""
    folder = os.environ.get(ENV)
    if not folder or not torch.cuda.is_available():
        return None
    nbytes = sealed_bytes(Path(folder), rank)
    if nbytes is None:
        return None
    return hoststaging.warm(nbytes, CHUNK, threads()[0], torch.cuda.current_device())

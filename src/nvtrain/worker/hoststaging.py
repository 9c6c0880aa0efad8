"""The page-locked buffers a restore into GPU memory reads through, kept for the process and set
up before the restore that needs them.

``hostread`` copies a host copy bound for GPU memory through staging buffers (up to
``2 x readers + 1`` of them, ``CHUNK`` bytes each) that must be page-locked for the copies to the
GPU to run at full speed and without blocking. Page-locking that much memory is slow, and torch
keeps page-locked memory once it has been freed (its caching host allocator), so before this
module only the first restore in a process paid for it: on an H100 the first of five 4 GB
restores in a process took 0.57-0.78 s where the later ones took 0.26-0.40 s (BENCHMARKS.md,
"In-process failure window 10 ms, restore in 32 MiB chunks"), and a worker that replaces a
killed one restores exactly once.

So the buffers are taken from here (``borrow``): allocated once per process, lent to one restore
at a time, and set up ahead (``warm``) in a background thread:

- in a replacement worker, at its start, when this pod's folder holds a host copy of its rank
  (``restore_ahead.warm_restore``): the buffers are made while it joins the process group and builds
  its model;
- in every worker, once its host copy's slots are mapped (``HostCopy.prepare``), so that the
  first in-process restart does not pay for them either.

The buffers cost ``buffers_for`` x ``CHUNK`` bytes of page-locked host memory per rank (at most
13 x 32 MiB = 416 MiB on 16 cores, fewer for a smaller state), on top of the host copy's two
slots (2 x the state, page-locked too): docs/worker.md, "Host copy". CPU-only restores use no
page-locked memory and nothing here.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import threading
from collections.abc import Iterator

import torch

__all__ = ["borrow", "buffers_for", "kept_bytes", "made", "warm"]


class _Pool:
    lock = threading.Lock()
    """Guards ``free`` and ``warming``."""
    made: list[torch.Tensor] = []
    """Every page-locked buffer made here (``free`` or lent to a restore)."""
    free: list[torch.Tensor] = []
    """Page-locked buffers no restore is using."""
    warming: threading.Event | None = None
    """Set when the background set-up under way (if any) has ended."""


def buffers_for(nbytes: int, chunk: int, readers: int) -> int:
    """How many staging buffers a restore of ``nbytes`` uses: one per chunk read ahead of the
    one being hashed (``2 x readers``), plus that one; no more than the copy has chunks, and at
    least two (one read ahead)."""
    return max(2, min(2 * readers + 1, math.ceil(nbytes / chunk)))


def made() -> int:
    """How many page-locked buffers the process has made for restores (lent or not)."""
    with _Pool.lock:
        return len(_Pool.made)


def kept_bytes() -> int:
    """Bytes of page-locked buffers the process keeps for restores and no restore is using."""
    with _Pool.lock:
        return sum(t.numel() for t in _Pool.free)


def _make(size: int) -> torch.Tensor:
    buffer = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    with _Pool.lock:
        _Pool.made.append(buffer)
    return buffer


def _allocate(count: int, size: int) -> None:
    """Make page-locked buffers of ``size`` bytes until ``count`` of them are free."""
    while True:
        with _Pool.lock:
            if sum(1 for t in _Pool.free if t.numel() >= size) >= count:
                return
        buffer = _make(size)
        with _Pool.lock:
            _Pool.free.append(buffer)


def warm(nbytes: int, chunk: int, readers: int, device: int) -> threading.Event:
    """Start setting up, in a daemon thread, the buffers a restore of ``nbytes`` into GPU
    ``device`` will borrow; returns an event set when that has ended. A no-op (the event of the
    set-up under way, or one already set) when the buffers are made (lent or not) or being made. An error
    there is dropped: the restore then makes its buffers itself."""
    count, size = buffers_for(nbytes, chunk, readers), min(chunk, max(nbytes, 1))
    with _Pool.lock:
        if _Pool.warming is not None and not _Pool.warming.is_set():
            return _Pool.warming
        if sum(1 for t in _Pool.made if t.numel() >= size) >= count:
            done = threading.Event()
            done.set()
            return done
        _Pool.warming = done = threading.Event()

    def run() -> None:
        try:
            # A new thread's current device is GPU 0: without this, page-locking would make a
            # CUDA context there when this rank has none yet (another rank's GPU).
            torch.cuda.set_device(device)
            _allocate(count, size)
        except Exception:  # noqa: BLE001 - only a head start: the restore makes them itself
            pass
        finally:
            done.set()

    # (at exit, wait for it: CUDA torn down under a page-locking call could crash the process)
    atexit.register(done.wait, 60.0)
    threading.Thread(target=run, daemon=True, name="nvtrain-restore-staging").start()
    return done


@contextlib.contextmanager
def borrow(count: int, size: int, *, pinned: bool) -> Iterator[list[torch.Tensor]]:
    """``count`` buffers of ``size`` bytes for one restore. Page-locked ones (``pinned``) come
    from the process's buffers (made now when there are too few; after the set-up under way, if
    any, has ended) and go back at the end: the caller has finished every copy out of them by
    then. Others are made for the restore and freed after it."""
    if not pinned:
        yield [torch.empty(size, dtype=torch.uint8) for _ in range(count)]
        return
    warming = _Pool.warming
    if warming is not None:
        # (making them at the same time would only make both slower; a set-up that has not
        # ended in a minute is not waited for longer)
        warming.wait(60.0)
    _allocate(count, size)
    with _Pool.lock:
        fitting = [t for t in _Pool.free if t.numel() >= size][:count]
        taken = {id(t) for t in fitting}
        _Pool.free = [t for t in _Pool.free if id(t) not in taken]
    # (another restore at the same time may have taken some meanwhile: it gets its own)
    lent = fitting + [_make(size) for _ in range(count - len(fitting))]
    try:
        yield [t[:size] for t in lent]
    finally:
        with _Pool.lock:
            _Pool.free.extend(lent)

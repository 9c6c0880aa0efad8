"""A host copy's data file read into the live state, and checked while it is read.

The data file is mapped read-only and copied chunk by chunk (``CHUNK``) into the tensors the
state is made of: large pieces of CPU tensors straight into their memory; padding, small tensors
and GPU tensors through a staging buffer (page-locked when some of it goes to the GPU, on a side
stream: ``hoststaging`` lends those, made once per process), each run of them in one copy. Each
chunk is fed to the keyed hash where it landed, right after it was copied, while it is still in
the cache; reader threads copy the next chunks meanwhile (both let go of the GIL). So a restore
is one pass over the copy, where it used to be a pass to hash the mapped file and another to
copy it, and the hash covers exactly the bytes the state ends up made of, hashed in this
process's own memory: a process that writes the file after the header was checked, or during
the read, changes nothing that is used without being caught. (Only the worker's own memory is
trusted here, as in docs/security.md: a process of this user's could write it through
``ptrace``, and could do anything else the worker can.)

Until the last chunk has been hashed and the digest matches the header's, what the destinations
hold is not state: when it does not match, or a read fails, every destination is filled with
NaN (zeros where the dtype has none), so that nothing can train on half a copy by mistake, and
``Rejected`` is raised; the caller then restores from storage, which overwrites them all.

Files are opened without following links and used only when they are regular files of this
user's that group and others cannot open (as ``hostcopy`` makes them, in its private folder),
and the data file only when it is as long as its header says (so the mapping holds no page past
its end).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hmac
import mmap
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import blake3
import numpy
import torch

from nvtrain.worker import hoststaging

__all__ = ["CHUNK", "Rejected", "open_private", "read_checked", "read_private", "threads"]

CHUNK = 32 << 20
"""Bytes read and hashed at a time: large enough that the per-chunk work in Python and the
hash's hand-off to its threads are a small part of it (on a 16-core host 32 MiB restored 4 GB
into GPU memory at 10.2 GB/s where 8 MiB gave 5.5; on 2 cores the two are even: BENCHMARKS.md)."""


_SMALL = 256 << 10
"""Pieces of tensors smaller than this go through the staging buffer (``_schedule``)."""


class Rejected(ValueError):
    """The copy cannot be used (a file that is not private, too short, or does not match its
    hash); the destinations given to ``read_checked`` hold no state."""


def _not_private(info: os.stat_result) -> str:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != os.geteuid():
        return f"belongs to uid {info.st_uid}, not to this process's uid {os.geteuid()}"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return f"has mode {stat.S_IMODE(info.st_mode):04o}: group or others may open it"
    return ""


def open_private(path: Path) -> int:
    """A read-only descriptor of ``path`` when it is a private file of this user's (not a link,
    not opened to group or others); else ``Rejected`` (``OSError`` when it cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if os.path.islink(path):
            raise Rejected(f"{path.name} is a symbolic link") from None
        raise exc
    problem = _not_private(os.fstat(fd))
    if problem:
        os.close(fd)
        raise Rejected(f"{path.name} {problem}")
    return fd


def read_private(path: Path) -> bytes:
    """All of ``path``, a private file of this user's (``open_private``)."""
    fd = open_private(path)
    try:
        parts = []
        while chunk := os.read(fd, max(os.fstat(fd).st_size, 1 << 16)):
            parts.append(chunk)
    finally:
        os.close(fd)
    return b"".join(parts)


def threads(cpus: int | None = None) -> tuple[int, int]:
    """(reader threads, hash threads) for a restore on ``cpus`` cores (default: the ones this
    process may run on): half the cores copy (up to 6), the others hash (up to 10); the ranks of
    a node restore at the same time. (Giving the hash one more thread than there are cores left
    was slower on 2 cores; 6 + 10 against 4 + 8 on a 16-core host: 13.5 against 10.2 GB/s:
    BENCHMARKS.md.)"""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0))
    readers = min(6, max(1, cpus // 2))
    return readers, min(10, max(1, cpus - readers))


class _Targets:
    """Where each destination's bytes go: straight into a CPU tensor's memory (``direct``), or
    through the staging buffer into a GPU tensor's bytes (``device``). A destination that is not
    contiguous gets a contiguous stand-in, copied into it at the end. (Per destination, one
    object that the cycle collector tracks lives on, the tensor under ``direct``'s array: with
    thousands of tensors, more set off collections that walk the whole live state: a third of a
    16,000-tensor restore took that long before.)"""

    def __init__(self, destinations: Sequence[torch.Tensor]) -> None:
        self.direct: list[numpy.ndarray[Any, Any] | None] = []
        self.device: dict[int, torch.Tensor] = {}
        self.standins: list[tuple[torch.Tensor, torch.Tensor]] = []
        for index, tensor in enumerate(destinations):
            dense = tensor.detach()
            if not dense.is_contiguous():
                dense = torch.empty_like(dense, memory_format=torch.contiguous_format)
                self.standins.append((tensor, dense))
            flat = dense.reshape(-1).view(torch.uint8)
            if flat.device.type == "cpu":
                self.direct.append(flat.numpy())
            else:
                self.direct.append(None)
                self.device[index] = flat

    def nbytes(self, index: int) -> int:
        direct = self.direct[index]
        return len(direct) if direct is not None else self.device[index].numel()


_Piece = tuple[int, int, int, int]
"""(offset in the file, bytes, index of the destination or -1 for the padding between two, offset
in the destination)."""


def _plan(spans: Sequence[tuple[int, int]], total: int, chunk: int) -> list[list[_Piece]]:
    """The pieces of the file's first ``total`` bytes, chunk by chunk: ``spans`` are the
    destinations' (offset, bytes) in file order; what lies between them is padding."""
    chunks: list[list[_Piece]] = [[]]
    end = chunk

    def add(offset: int, size: int, index: int) -> None:
        nonlocal end
        at = 0
        while size > 0:
            take = min(size, end - offset)
            chunks[-1].append((offset, take, index, at))
            offset, at, size = offset + take, at + take, size - take
            if offset == end:
                chunks.append([])
                end += chunk

    cursor = 0
    for index, (offset, size) in enumerate(spans):
        assert offset >= cursor, "the spans overlap or are out of order"
        add(cursor, offset - cursor, -1)
        add(offset, size, index)
        cursor = offset + size
    assert total >= cursor, "a span ends past the data"
    add(cursor, total - cursor, -1)
    return [pieces for pieces in chunks if pieces]


def read_checked(
    path: Path,
    spans: Sequence[tuple[int, int]],
    total: int,
    destinations: Sequence[torch.Tensor],
    *,
    key: bytes,
    digest: str,
    chunk: int = CHUNK,
    readers: int | None = None,
    hashers: int | None = None,
) -> None:
    """Read the data file ``path`` into ``destinations`` (the bytes at ``spans[i]``, an (offset,
    size) pair, into ``destinations[i]``, whose size it is) and check that its first ``total``
    bytes, padding included, have the keyed BLAKE3 ``digest`` under ``key``. ``Rejected`` when
    they do not, or the file is short or not private; ``OSError`` when it cannot be read. Either
    way the destinations are then filled with NaN or zeros."""
    assert len(spans) == len(destinations)
    default_readers, default_hashers = threads()
    fd = open_private(path)
    targets = _Targets(destinations)
    try:
        for index, (_, size) in enumerate(spans):
            assert targets.nbytes(index) == size, "a destination's size is not its span's"
        size = os.fstat(fd).st_size
        if size < total:  # (beyond its end, the mapping would be a SIGBUS)
            raise Rejected(f"the data file holds {size} bytes, its header says {total}")
        mapped = mmap.mmap(fd, total, prot=mmap.PROT_READ) if total else None
        reader = None
        try:
            chunks = _plan(spans, total, chunk)
            readers = readers or default_readers
            size = max((sum(p[1] for p in pieces) for pieces in chunks), default=0)
            count = hoststaging.buffers_for(total, chunk, readers)
            with hoststaging.borrow(count, size, pinned=bool(targets.device)) as staging:
                reader = _Reader(mapped, targets, chunks, readers, staging)
                reader.run(key, digest, hashers or default_hashers)
        finally:
            if reader is not None:
                reader.source = None
            if mapped is not None:
                # (an error's traceback may still hold a view of it: then it is unmapped with that)
                with contextlib.suppress(BufferError):
                    mapped.close()
    except BaseException:
        _spoil(destinations)
        raise
    finally:
        os.close(fd)
    with torch.no_grad():
        for tensor, dense in targets.standins:
            tensor.copy_(dense)


def _spoil(destinations: Sequence[torch.Tensor]) -> None:
    """Leave nothing of a copy that failed its check in ``destinations``."""
    with torch.no_grad():
        for tensor in destinations:
            if tensor.is_floating_point() or tensor.is_complex():
                tensor.fill_(float("nan"))
            else:
                tensor.zero_()
    if any(t.device.type == "cuda" for t in destinations):
        torch.cuda.synchronize()


def _schedule(pieces: list[_Piece], targets: _Targets) -> tuple[list[_Piece], list[_Piece]]:
    """How one chunk's ``pieces`` are copied: (the copies out of the file, in file order; the
    copies out of the staging buffer after it is hashed). A large piece of a CPU tensor is
    copied straight into it; the rest (padding, small tensors, GPU tensors) into the staging
    buffer, each run of them in one copy: a chunk of many small tensors then costs its reader
    threads one copy, not one per tensor, and the hash one update."""
    reads: list[_Piece] = []
    scatter: list[_Piece] = []
    for offset, size, index, at in pieces:
        if index >= 0 and targets.direct[index] is not None and size >= _SMALL:
            reads.append((offset, size, index, at))
            continue
        if index >= 0:
            scatter.append((offset, size, index, at))
        if reads and reads[-1][2] < 0:
            reads[-1] = (reads[-1][0], reads[-1][1] + size, -1, 0)
        else:
            reads.append((offset, size, -1, 0))
    return reads, scatter


class _Reader:
    """One restore's chunks: copied out of the mapped file by a pool of threads, hashed in order
    (and copied on out of the staging buffers) by the caller's."""

    def __init__(
        self,
        mapped: mmap.mmap | None,
        targets: _Targets,
        chunks: list[list[_Piece]],
        readers: int,
        staging: list[torch.Tensor],
    ) -> None:
        self.source = numpy.frombuffer(mapped, dtype=numpy.uint8) if mapped is not None else None
        self.direct, self.flat = targets.direct, targets.device
        self.starts = [pieces[0][0] for pieces in chunks]
        self.plans = [_schedule(pieces, targets) for pieces in chunks]
        self.readers = readers
        self.window = len(staging) - 1
        """Chunks read ahead of the one being hashed (``2 x readers``, fewer for a small copy)."""
        devices = {t.device for t in targets.device.values()}
        assert len(devices) <= 1 and {d.type for d in devices} <= {"cuda"}, (
            f"a rank's state is on the CPU and one GPU, not on {sorted(map(str, devices))}"
        )
        self.device = next(iter(devices), None)
        self.stream: Any = None
        self.staging = staging
        """Where what is not copied straight into a tensor goes first (page-locked when some
        of it goes on to the GPU: ``hoststaging``'s, lent for this restore)."""
        self.staged = [t.numpy() for t in self.staging]
        self.done: list[Any] = [None] * len(self.staging)
        """Per staging buffer: a CUDA event recorded after the copies out of it."""

    def _read(self, k: int) -> None:
        """Copy chunk ``k`` out of the file."""
        event = self.done[k % len(self.done)]
        if event is not None:  # the staging buffer's copies to the GPU are not done yet
            event.synchronize()
        source = self.source
        assert source is not None
        stage, start = self.staged[k % len(self.staged)], self.starts[k]
        for offset, size, index, at in self.plans[k][0]:
            direct = self.direct[index] if index >= 0 else None
            into = stage[offset - start : offset - start + size] if direct is None else direct[at : at + size]
            numpy.copyto(into, source[offset : offset + size])  # (lets go of the GIL)

    def run(self, key: bytes, digest: str, hashers: int) -> None:
        hasher = blake3.blake3(key=key, max_threads=hashers)
        if self.device is not None:
            self.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        chunks = len(self.plans)
        try:
            with concurrent.futures.ThreadPoolExecutor(
                self.readers, thread_name_prefix="nvtrain-restore"
            ) as pool:
                reads = {k: pool.submit(self._read, k) for k in range(min(self.window, chunks))}
                try:
                    for k in range(chunks):
                        reads.pop(k).result()
                        self._hash(k, hasher)
                        if k + self.window < chunks:
                            reads[k + self.window] = pool.submit(self._read, k + self.window)
                finally:  # (leaving the pool waits for the reads under way)
                    for future in reads.values():
                        future.cancel()
        finally:
            if self.stream is not None:
                self.stream.synchronize()
        if not hmac.compare_digest(hasher.hexdigest(), digest):
            raise Rejected("the data does not match its hash")

    def _hash(self, k: int, hasher: Any) -> None:
        """Hash chunk ``k`` where it was copied to; then copy what is in the staging buffer on
        into its tensors (on a side stream for GPU tensors)."""
        stage, staged, start = (
            self.staging[k % len(self.staging)],
            self.staged[k % len(self.staged)],
            self.starts[k],
        )
        reads, scatter = self.plans[k]
        for offset, size, index, at in reads:
            direct = self.direct[index] if index >= 0 else None
            hasher.update(
                staged[offset - start : offset - start + size] if direct is None else direct[at : at + size]
            )
        gpu = []
        for offset, size, index, at in scatter:
            direct = self.direct[index]
            if direct is None:
                gpu.append((offset, size, index, at))
            else:
                numpy.copyto(direct[at : at + size], staged[offset - start : offset - start + size])
        if not gpu:
            return
        with torch.cuda.stream(self.stream):
            for offset, size, index, at in gpu:
                piece = stage[offset - start : offset - start + size]
                self.flat[index][at : at + size].copy_(piece, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self.stream)
        self.done[k % len(self.done)] = event

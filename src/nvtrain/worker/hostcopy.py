"""A rank's staged checkpoint in files that outlive the worker process.

``nvtrain run`` makes one folder per pod in memory-backed storage (``[checkpoint] memory_dir``,
``/dev/shm`` by default), hands it to the workers as ``NVTRAIN_HOST_COPY_DIR`` and removes it when
the run ends. An async save stages the rank's state straight into a memory-mapped file there (the
staging buffer *is* the file: no extra copy), so a replacement worker of the same rank, after a
SIGKILL, an OOM kill or a segfault, restores from host memory instead of storage.

Each rank has two slots, so that the copy of the newest committed checkpoint stays whole while the
next save is staged into the other one. Per slot::

    rank3.slot0.bin     the tensors, one after another (64-byte aligned); pinned on a GPU
    rank3.slot0.extra   the rest of the state (optimizer settings, RNG, data-loader position)
    rank3.slot0.json    the header, written last (renamed into place), removed before restaging

The header names the run id, rank, world size, step, the commit's token (the id that rank 0 writes
into that step's COMMITTED file), the state's layout, and xxh3 hashes of the data and the extra
file. A copy is used only when every one of them matches the checkpoint being restored and the
live model; otherwise the rank says why and the run restores from storage. So a copy that is
stale (an older step, or a step whose save was dropped and redone), partial (a worker killed
while staging: no header), foreign (another run, rank or world size) or damaged is never loaded.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import itertools
import json
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["ENV", "HostCopy", "Unsupported", "host_copy", "in_background"]

ENV = "NVTRAIN_HOST_COPY_DIR"
"""The folder ``nvtrain run`` keeps for this pod's host copies (unset: copies live in the
process only)."""

FORMAT = 2
"""Version of the slot files (2: hashes made of the 64 MiB pieces' hashes)."""
_ALIGN = 64
_SLOTS = 2
_HASH_CHUNK = 64 << 20
_HASH_THREADS = 8


class Unsupported(ValueError):
    """A state with tensors this module cannot lay out (e.g. FSDP1's ``ShardedTensor``)."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    local = getattr(tensor, "_local_tensor", None)  # a DTensor's shard on this rank
    if isinstance(local, torch.Tensor):
        return local
    if type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
        raise Unsupported(f"cannot keep a {type(tensor).__name__} in a host copy")
    return tensor


def _leaves(state: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], torch.Tensor]]:
    """The tensors of ``state`` with their paths, in a fixed order."""
    if hasattr(state, "local_shards"):
        raise Unsupported(f"cannot keep a {type(state).__name__} in a host copy")
    if isinstance(state, torch.Tensor):
        yield path, state
    elif isinstance(state, dict):
        for key, value in state.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(state, list | tuple):
        for index, value in enumerate(state):
            yield from _leaves(value, (*path, index))


@dataclasses.dataclass(frozen=True)
class _Leaf:
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each tensor of a state lives in a slot's data file."""

    leaves: tuple[_Leaf, ...]
    nbytes: int
    digest: str
    """Names the paths, shapes and dtypes: a copy is loaded only into the same layout."""

    @staticmethod
    def of(state: Any) -> Layout:
        leaves, offset, described = [], 0, []
        for path, tensor in _leaves(state):
            local = _local(tensor)
            nbytes = local.numel() * local.element_size()
            leaves.append(_Leaf(tuple(local.shape), local.dtype, offset, nbytes))
            described.append(f"{path!r}:{tuple(local.shape)}:{local.dtype}")
            offset += -(-max(nbytes, 1) // _ALIGN) * _ALIGN
        digest = hashlib.sha256("\n".join(described).encode()).hexdigest()[:32]
        return Layout(tuple(leaves), offset, digest)


class _Ref:
    """Stands for tensor ``index`` of a slot in the pickled rest of a state."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _map(state: Any, leaf: Callable[[Any], Any]) -> Any:
    """``state`` with every leaf (anything but a dict, list or tuple) replaced by ``leaf(it)``,
    in the order ``_leaves`` walks it."""
    if isinstance(state, dict):
        return {key: _map(value, leaf) for key, value in state.items()}
    if isinstance(state, list):
        return [_map(value, leaf) for value in state]
    if isinstance(state, tuple):
        return tuple(_map(value, leaf) for value in state)
    return leaf(state)


def _skeleton(state: Any) -> Any:
    """``state`` with its tensors replaced by ``_Ref``s, numbered in order: the rest of it."""
    count = itertools.count()
    return _map(state, lambda x: _Ref(next(count)) if isinstance(x, torch.Tensor) else x)


def _hash(data: memoryview | bytes) -> str:
    """xxh3 of the xxh3 digests of ``data``'s 64 MiB pieces, hashed in parallel (xxhash lets go
    of the GIL): the check of a 4 GB copy before a restore takes a fraction of one thread's time."""
    import concurrent.futures

    import xxhash

    view = memoryview(data)
    pieces = [view[start : start + _HASH_CHUNK] for start in range(0, len(view), _HASH_CHUNK)]
    if len(pieces) > 1:
        with concurrent.futures.ThreadPoolExecutor(min(len(pieces), _HASH_THREADS)) as pool:
            digests = list(pool.map(lambda piece: xxhash.xxh3_64_digest(piece), pieces))
    else:
        digests = [xxhash.xxh3_64_digest(piece) for piece in pieces]
    return xxhash.xxh3_64_hexdigest(b"".join(digests))


class _Slot:
    """One of a rank's two copies: a memory-mapped data file, the rest of the state, a header."""

    def __init__(self, folder: Path, stem: str, index: int) -> None:
        self.data = folder / f"{stem}.bin"
        self.extra = folder / f"{stem}.extra"
        self.header = folder / f"{stem}.json"
        self.index = index
        self.map: mmap.mmap | None = None
        self.flat: torch.Tensor | None = None
        self.views: list[torch.Tensor] = []
        self.pinned = False
        self.generation = 0
        """Bumped each time the slot is restaged: a background seal of an older staging is
        dropped."""
        self.skeleton: Any = None
        self.step: int | None = None
        """The step sealed in this slot by this process (None: none, or being restaged)."""

    def open(self, layout: Layout) -> None:
        """Map the data file at ``layout``'s size (creating or resizing it; its memory is
        reserved here, so a full ``/dev/shm`` is an ``OSError`` now, not a SIGBUS later)."""
        self.open_bytes(layout.nbytes)
        self._views(layout)

    def open_bytes(self, nbytes: int) -> None:
        """Map the data file at ``nbytes`` (see ``open``); no views."""
        size = max(nbytes, 1)
        if self.map is not None and len(self.map) == size:
            return
        self.close()
        fd = os.open(self.data, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != size:
                with contextlib.suppress(OSError):
                    self.header.unlink()
                os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.flat = torch.frombuffer(self.map, dtype=torch.uint8)

    def _views(self, layout: Layout) -> None:
        assert self.flat is not None
        self.views = [
            self.flat[leaf.offset : leaf.offset + leaf.nbytes].view(leaf.dtype).view(leaf.shape)
            for leaf in layout.leaves
        ]

    def pin(self) -> None:
        """Page-lock the mapping for fast, non-blocking copies from the GPU."""
        if self.pinned or self.flat is None or not torch.cuda.is_available():
            return
        cudart: Any = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        code = cudart.cudaHostRegister(self.flat.data_ptr(), self.flat.numel(), 0)
        self.pinned = int(code) == 0

    def close(self) -> None:
        if self.pinned and self.flat is not None:
            cudart: Any = torch.cuda.cudart()  # type: ignore[no-untyped-call]
            cudart.cudaHostUnregister(self.flat.data_ptr())
        self.pinned = False
        self.views, self.flat = [], None
        if self.map is not None:
            with contextlib.suppress(BufferError):
                self.map.close()
        self.map = None

    def read_header(self) -> dict[str, Any] | None:
        try:
            header = json.loads(self.header.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return header if isinstance(header, dict) else None

    def drop_header(self) -> None:
        """The slot is being rewritten: until its new header is in place it is no copy."""
        with contextlib.suppress(FileNotFoundError):
            self.header.unlink()

    def write_rest(self, extra: bytes, header: bytes) -> None:
        """Put the extra state, then the header, in place (each renamed in whole)."""
        for path, data in ((self.extra, extra), (self.header, header)):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)


class HostCopy:
    """This rank's two slots in ``folder``. Also the ``AsyncStager`` of its async saves: the
    staged state handed to torch's writer is made of views into the slot's mapped file."""

    def __init__(self, folder: Path, *, run_id: str, rank: int, world: int) -> None:
        self.folder = folder
        self.run_id = run_id
        self.rank = rank
        self.world = world
        self.slots = [_Slot(folder, f"rank{rank}.slot{i}", i) for i in range(_SLOTS)]
        self.layout: Layout | None = None
        self.lock = threading.Lock()
        self.keep: int | None = None
        """The newest committed step: ``stage`` never overwrites the slot that holds it."""
        self.last: _Slot | None = None
        """The slot of the latest ``stage``."""
        self.ready = threading.Event()
        self.ready.set()
        self.broken = False
        """The folder cannot hold the slots (no room): this process keeps no host copy."""

    # -- torch's AsyncStager protocol ---------------------------------------------------------
    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def synchronize_staging(self) -> None:
        return None

    def close(self) -> None:
        """Nothing to free between saves: the slots live as long as the process."""

    # -- preparing ------------------------------------------------------------------------------
    def prepare(self, state: Any) -> None:
        """Lay out ``state`` and map (on a GPU, also pin) both slots; may run in a background
        thread right after the restore, so that the first save blocks no longer than the next."""
        layout = Layout.of(state)
        with self.lock:
            if self.layout != layout:
                self.layout = layout
                for slot in self.slots:
                    slot.step = None
            for slot in self.slots:
                slot.open(layout)
                slot.pin()

    def release(self) -> None:
        """Unmap this rank's slots and remove their files (the copy is given up)."""
        with self.lock:
            for slot in self.slots:
                slot.close()
                slot.step = None
                for path in (slot.header, slot.extra, slot.data):
                    with contextlib.suppress(OSError):
                        path.unlink()
            self.layout = None

    def prepare_in_background(self, state: Any) -> None:
        self.ready = in_background(self.prepare, state, name="nvtrain-host-copy")

    # -- saving -----------------------------------------------------------------------------
    def stage(self, state: Any) -> Any:
        """Copy ``state`` into a slot that does not hold the newest committed step; returns the
        same structure made of the slot's views (DTensors keep their spec)."""
        self.ready.wait()
        self.prepare(state)
        with self.lock:
            slot = next((s for s in self.slots if s.step is None), None) or next(
                s for s in self.slots if s.step != self.keep
            )
            slot.generation += 1
            slot.step = None
            with contextlib.suppress(FileNotFoundError):
                slot.header.unlink()
        cuda = torch.cuda.is_available()
        views = iter(slot.views)
        staged = self._fill(state, views, cuda)
        if cuda:
            torch.cuda.synchronize()
        slot.skeleton = _skeleton(state)
        self.last = slot
        return staged

    @staticmethod
    def _fill(state: Any, views: Iterator[torch.Tensor], non_blocking: bool) -> Any:
        """``state`` with each tensor copied into, and replaced by, the next view."""

        def leaf(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            view = next(views)
            view.copy_(_local(value), non_blocking=non_blocking)
            spec = getattr(value, "_spec", None)
            if spec is None:
                return view
            dtensor: Any = type(value)
            return dtensor(view, spec, requires_grad=False)  # a DTensor around the view

        return _map(state, leaf)

    def seal(self, slot: _Slot, generation: int, *, step: int, token: str, extra: dict[str, Any]) -> None:
        """After this rank's part of the save is written: hash the slot and write its header,
        unless the slot was restaged since ``generation`` (an earlier attempt's save, after an
        in-process restart)."""
        assert slot.map is not None and self.layout is not None
        import io

        buffer = io.BytesIO()
        torch.save({"skeleton": slot.skeleton, "extra": extra}, buffer)
        rest = buffer.getvalue()
        header = {
            "format": FORMAT,
            "run_id": self.run_id,
            "rank": self.rank,
            "world": self.world,
            "step": step,
            "token": token,
            "layout": self.layout.digest,
            "bytes": self.layout.nbytes,
            "data_hash": _hash(memoryview(slot.map)[: self.layout.nbytes]),
            "extra_hash": _hash(rest),
        }
        with self.lock:
            if slot.generation != generation:
                return
            slot.write_rest(rest, json.dumps(header, sort_keys=True).encode())
            slot.step = step

    def sealed(self, slot: _Slot, generation: int, *, step: int, token: str) -> tuple[bytes, bytes] | None:
        """(header, extra) of ``slot`` when it still holds the sealed copy of ``step``'s save
        ``token`` (not restaged since ``generation``); else None. What a peer copy is made of,
        with the slot's data."""
        with self.lock:
            if slot.generation != generation or slot.step != step or slot.map is None:
                return None
            try:
                header = slot.header.read_bytes()
                extra = slot.extra.read_bytes()
            except OSError:
                return None
        try:
            fields = json.loads(header)
        except ValueError:
            return None
        return (header, extra) if fields.get("token") == token and fields.get("step") == step else None

    def receiving_slot(self, layout: Layout) -> _Slot:
        """A slot to receive this rank's copy into from the pod that kept it (a replacement pod
        holds none of its own): mapped at ``layout``, no header until ``adopt``."""
        with self.lock:
            self.layout = layout
            slot = self.slots[0]
            slot.generation += 1
            slot.step = None
            slot.drop_header()
            slot.open(layout)
        return slot

    def adopt(self, slot: _Slot, header: bytes, extra: bytes) -> None:
        """``slot``'s data was received: put the received extra state and header in place;
        ``find`` then checks it like any copy of this rank's."""
        with self.lock:
            slot.write_rest(extra, header)

    def forget(self, step: int) -> None:
        """A save of ``step`` was dropped: its copy must never pass for a later commit of it."""
        with self.lock:
            for slot in self.slots:
                header = slot.read_header()
                if slot.step == step or (header is not None and header.get("step") == step):
                    slot.generation += 1
                    slot.step = None
                    with contextlib.suppress(FileNotFoundError):
                        slot.header.unlink()

    # -- restoring ------------------------------------------------------------------------------
    def find(self, *, step: int, token: str | None, state: Any) -> tuple[_Slot | None, str]:
        """The slot holding the commit ``token`` of ``step`` for this run, rank, world size and
        ``state``'s layout, with data and extra files that match their hashes; else why not."""
        if token is None:
            return None, f"step {step}'s COMMITTED file names no token"
        try:
            layout = Layout.of(state)
        except Unsupported as exc:
            return None, str(exc)
        problems = []
        for slot in self.slots:
            header = slot.read_header()
            if header is None:
                problems.append(f"slot {slot.index}: no header")
                continue
            wanted = {
                "format": FORMAT,
                "run_id": self.run_id,
                "rank": self.rank,
                "world": self.world,
                "step": step,
                "token": token,
                "layout": layout.digest,
                "bytes": layout.nbytes,
            }
            wrong = [
                f"{key} {header.get(key)!r} (wanted {value!r})"
                for key, value in wanted.items()
                if header.get(key) != value
            ]
            if wrong:
                problems.append(f"slot {slot.index}: {wrong[0]}")
                continue
            problem = self._check(slot, layout, header)
            if problem:
                problems.append(f"slot {slot.index}: {problem}")
                continue
            return slot, ""
        return None, "; ".join(problems)

    def _check(self, slot: _Slot, layout: Layout, header: dict[str, Any]) -> str:
        try:
            with self.lock:
                if self.layout != layout:
                    self.layout = layout
                slot.open(layout)
            assert slot.map is not None
            if _hash(memoryview(slot.map)[: layout.nbytes]) != header.get("data_hash"):
                return "the data does not match its hash"
            if _hash(slot.extra.read_bytes()) != header.get("extra_hash"):
                return "the extra state does not match its hash"
        except OSError as exc:
            return f"cannot read it: {exc}"
        return ""

    def load(self, slot: _Slot, live: Any) -> tuple[Any, dict[str, Any]]:
        """Copy ``slot`` into ``live``'s tensors; returns the state to apply (``live``'s tensors
        within the saved structure) and the extra state."""
        rest = torch.load(slot.extra, weights_only=False)
        cuda = torch.cuda.is_available()
        locals_ = [_local(t) for _, t in _leaves(live)]
        tensors = list(_leaves(live))

        def fill(value: Any) -> Any:
            if not isinstance(value, _Ref):
                return value
            locals_[value.index].copy_(slot.views[value.index], non_blocking=cuda)
            return tensors[value.index][1]

        state = _map(rest["skeleton"], fill)
        if cuda:
            torch.cuda.synchronize()
        with self.lock:
            slot.step = int(json.loads(slot.header.read_text(encoding="utf-8"))["step"])
        return state, rest["extra"]


def in_background(work: Any, *args: Any, name: str) -> threading.Event:
    """Run ``work(*args)`` in a daemon thread; the event is set when it has ended (an error is
    dropped: the save that needs the result does the work again, and raises there). The process
    waits for it at exit: torch aborts a process that exits during such a thread's copy."""
    done = threading.Event()

    def run() -> None:
        try:
            with contextlib.suppress(Exception):
                work(*args)
        finally:
            done.set()

    atexit.register(done.wait, 120.0)
    threading.Thread(target=run, daemon=True, name=name).start()
    return done


_COPIES: dict[tuple[str, str, int, int], HostCopy] = {}
"""Per (folder, run id, rank, world size): a process keeps its slots mapped (and pinned) across
in-process restarts."""


def host_copy(folder: Path, *, run_id: str, rank: int, world: int) -> HostCopy:
    key = (str(folder), run_id, rank, world)
    copy = _COPIES.get(key)
    if copy is None:
        copy = _COPIES[key] = HostCopy(folder, run_id=run_id, rank=rank, world=world)
    return copy

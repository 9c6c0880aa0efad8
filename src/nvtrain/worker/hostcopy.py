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
into that step's COMMITTED file), the state's layout, and keyed BLAKE3 hashes of the data and the
extra file; a MAC (keyed BLAKE3 over the canonical JSON of the other fields) seals it. The key is
the run's secret (``nvtrain.private.run_key``: a private file that ``nvtrain run`` writes, one
per node's launcher), so a copy that this node's launcher's workers did not write (or re-seal,
for a peer's copy: ``reseal``) does not verify. A copy is used only when its MAC verifies and
every field and hash matches the checkpoint being restored and the live model; otherwise the
rank says why and the run restores from storage. So a copy that is stale (an older step, or a
step whose save was dropped and redone), partial (a worker killed while staging: no header),
foreign (another run, rank or world size, or not this run's key), damaged or forged is never
loaded. A restore copies the data file straight into the live state's tensors and checks it
against its hash while it copies it, one chunk at a time (``hostread``): nothing of it is used
before all of it has matched. The extra file is read with ``torch.load(weights_only=True)``: the
state's tensors are replaced in it by empty placeholder tensors, matched to the data file's
tensors in the order ``_leaves`` walks the state (``plain``).

Without a run key (a worker not started by ``nvtrain run``), or when the folder is not private
(this user's, mode 0700, not a link: ``private.check_private_dir``), no copy is kept in files:
``usable`` says why, and the checkpointer keeps its copy in the process only.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import hmac
import json
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import torch

from nvtrain.private import RUN_KEY_ENV, NotPrivate, check_private_dir, run_key
from nvtrain.worker import hoststaging
from nvtrain.worker.hostread import CHUNK, Rejected, open_private, read_checked, read_private, threads
from nvtrain.worker.plain import check_plain, load_plain

__all__ = ["ENV", "HostCopy", "Unsupported", "header_paths", "host_copy", "in_background", "usable"]

ENV = "NVTRAIN_HOST_COPY_DIR"
"""The folder ``nvtrain run`` keeps for this pod's host copies (unset: copies live in the
process only)."""

FORMAT = 3
"""Version of the slot files (2: hashes made of the 64 MiB pieces' xxh3 hashes; 3: keyed BLAKE3
hashes, a MAC over the header, an extra file of plain data only)."""
_ALIGN = 64
_SLOTS = 2
_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable
_HEADER_FIELDS = ("format", "run_id", "rank", "world", "step", "token", "layout", "bytes")
"""The fields a copy is checked by (``find``); a re-sealed peer copy keeps them as they came."""


def usable(folder: Path) -> tuple[bytes | None, str]:
    """The run's key for host copies in ``folder``, or (None, why no copy is kept there)."""
    try:
        key = run_key()
    except (NotPrivate, OSError) as exc:
        return None, f"the run key ${RUN_KEY_ENV} names cannot be used: {exc}"
    if key is None:
        return None, (
            f"${RUN_KEY_ENV} is not set (the worker was not started by nvtrain run), so a copy there "
            "could not be told from a forged one"
        )
    problem = check_private_dir(folder)
    if problem is not None:
        return None, f"the folder {problem} (it must be this user's, mode 0700, not a link)"
    return key, ""


def _keys(key: bytes) -> tuple[bytes, bytes]:
    """The keys of the data/extra hashes and of the header's MAC, derived from the run's key."""
    derive = blake3.blake3
    return (
        derive(key, derive_key_context="nvtrain host copy 2026-12 data hash").digest(),
        derive(key, derive_key_context="nvtrain host copy 2026-12 header mac").digest(),
    )


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


_PLACEHOLDER = torch.empty(0, dtype=torch.uint8)
"""Where a tensor was in the extra file's skeleton (every tensor there is one: the state's own
tensors are in the data file, matched to the placeholders in the order ``_leaves`` walks)."""


def _skeleton(state: Any) -> Any:
    """``state`` with its tensors replaced by the placeholder: the rest of it, plain data."""
    return _map(state, lambda x: _PLACEHOLDER if isinstance(x, torch.Tensor) else x)


def _hash(data: memoryview | bytes, key: bytes) -> str:
    """Keyed BLAKE3 of ``data`` with the data key of ``_keys``, on as many threads as there are
    cores (blake3 lets go of the GIL)."""
    return blake3.blake3(data, key=key, max_threads=blake3.blake3.AUTO).hexdigest()


def _mac(fields: dict[str, Any], key: bytes) -> str:
    """Keyed BLAKE3 (the MAC key of ``_keys``) over the canonical JSON of ``fields``, but "mac"."""
    text = json.dumps({k: v for k, v in fields.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
    return blake3.blake3(text.encode(), key=key).hexdigest()


def _sealed_header(fields: dict[str, Any], data: memoryview, extra: bytes, key: bytes) -> bytes:
    """The header of a copy: ``fields`` (``_HEADER_FIELDS``), the keyed hashes of ``data`` and
    ``extra``, and the MAC over them all."""
    data_key, mac_key = _keys(key)
    header = {k: fields[k] for k in _HEADER_FIELDS}
    header["data_hash"] = _hash(data, data_key)
    header["extra_hash"] = _hash(extra, data_key)
    header["mac"] = _mac(header, mac_key)
    return json.dumps(header, sort_keys=True).encode()


def verify_mac(header: dict[str, Any], key: bytes) -> bool:
    """Whether ``header``'s MAC is the one this run's ``key`` makes."""
    mac = header.get("mac")
    return isinstance(mac, str) and hmac.compare_digest(mac, _mac(header, _keys(key)[1]))


def check_hashes(slot: _Slot, header: dict[str, Any], nbytes: int, key: bytes) -> str:
    """Why the first ``nbytes`` of ``slot``'s mapped data, or its extra file, do not match the
    keyed hashes in ``header``; "" when they do. (A peer's kept copy, checked before it is sent
    back; a restore checks its own copy while it reads it: ``HostCopy.load``.)"""
    assert slot.map is not None
    data_key = _keys(key)[0]
    try:
        data = _hash(memoryview(slot.map)[:nbytes], data_key)
        if not hmac.compare_digest(data, str(header.get("data_hash"))):
            return "the data does not match its hash"
        extra = _hash(slot.extra.read_bytes(), data_key)
        if not hmac.compare_digest(extra, str(header.get("extra_hash"))):
            return "the extra state does not match its hash"
    except OSError as exc:
        return f"cannot read it: {exc}"
    return ""


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` at mode 0600, never through a link (a leftover is removed)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


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
        self.verified: dict[str, Any] | None = None
        """The header ``find`` verified (``load`` checks the data it reads against it)."""
        self.verified_extra: bytes | None = None
        """The extra file as ``find`` read it and checked it against ``verified``."""
        self.verified_layout: Layout | None = None
        """The live state's layout that ``verified`` matched."""
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
        fd = os.open(self.data, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
        # Portable: page-locked for every CUDA context of the process, not only the one current
        # in the calling thread (``prepare`` runs in a background thread).
        code = cudart.cudaHostRegister(self.flat.data_ptr(), self.flat.numel(), _REGISTER_PORTABLE)
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
        """Put the extra state, then the header, in place (each renamed in whole; 0600)."""
        for path, data in ((self.extra, extra), (self.header, header)):
            tmp = path.with_name(path.name + ".tmp")
            _write_private(tmp, data)
            os.replace(tmp, path)

    def reseal(self, header: bytes, extra: bytes, key: bytes) -> bool:
        """This slot's data was received from a peer with ``header`` (sealed with the sender's
        node's key) and ``extra``: seal it with this node's ``key`` (the fields as they came,
        hashes of what is here) and put it in place. False when ``header`` is no copy's."""
        try:
            fields = json.loads(header)
            nbytes = int(fields["bytes"])
        except (ValueError, KeyError, TypeError):
            return False
        if (
            self.map is None
            or not all(k in fields for k in _HEADER_FIELDS)
            or not 0 <= nbytes <= len(self.map)
        ):
            return False
        self.write_rest(extra, _sealed_header(fields, memoryview(self.map)[:nbytes], extra, key))
        return True


def _slots(folder: Path, rank: int) -> list[_Slot]:
    return [_Slot(folder, f"rank{rank}.slot{i}", i) for i in range(_SLOTS)]


def header_paths(folder: Path, rank: int) -> list[Path]:
    """Where ``rank``'s slot headers are in ``folder`` (sealed copies have one)."""
    return [slot.header for slot in _slots(folder, rank)]


class HostCopy:
    """This rank's two slots in ``folder``. Also the ``AsyncStager`` of its async saves: the
    staged state handed to torch's writer is made of views into the slot's mapped file."""

    def __init__(self, folder: Path, *, run_id: str, rank: int, world: int, key: bytes) -> None:
        self.folder = folder
        self.key = key
        self.run_id = run_id
        self.rank = rank
        self.world = world
        self.slots = _slots(folder, rank)
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
        self.staging_ready: threading.Event | None = None
        """Set once a restore's page-locked staging buffers are made (None: not asked for, the
        state is not on a GPU): ``hoststaging.warm``."""

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
            gpu = next((t.device for _, t in _leaves(state) if t.device.type == "cuda"), None)
            if gpu is not None:
                # The first in-process restart's restore then finds its staging buffers made.
                self.staging_ready = hoststaging.warm(layout.nbytes, CHUNK, threads()[0], gpu.index)

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

        check_plain("(the model and optimizer state)", slot.skeleton)  # what load_plain reads back
        buffer = io.BytesIO()
        torch.save({"skeleton": slot.skeleton, "extra": extra}, buffer)
        rest = buffer.getvalue()
        fields = {
            "format": FORMAT,
            "run_id": self.run_id,
            "rank": self.rank,
            "world": self.world,
            "step": step,
            "token": token,
            "layout": self.layout.digest,
            "bytes": self.layout.nbytes,
        }
        header = _sealed_header(fields, memoryview(slot.map)[: self.layout.nbytes], rest, self.key)
        with self.lock:
            if slot.generation != generation:
                return
            slot.write_rest(rest, header)
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
        if not isinstance(fields, dict) or not verify_mac(fields, self.key):
            return None
        if _hash(extra, _keys(self.key)[0]) != fields.get("extra_hash"):
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

    def adopt(self, slot: _Slot, header: bytes, extra: bytes) -> bool:
        """``slot``'s data was received from the peer that kept it (which checked it with its
        node's key before sending): seal it with this node's key (``_Slot.reseal``); ``find``
        then checks its fields like any copy of this rank's. False when ``header`` is none."""
        with self.lock:
            return slot.reseal(header, extra, self.key)

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
        ``state``'s layout, whose header's MAC verifies, whose extra file matches its hash and
        whose files are private and whole; else why not. Its data is checked by ``load``, while
        it is read."""
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
            if not verify_mac(header, self.key):
                problems.append(f"slot {slot.index}: its header's MAC does not verify (not this run's copy)")
                continue
            problem = self._check(slot, layout, header)
            if problem:
                problems.append(f"slot {slot.index}: {problem}")
                continue
            return slot, ""
        return None, "; ".join(problems)

    def _check(self, slot: _Slot, layout: Layout, header: dict[str, Any]) -> str:
        """Why ``slot``'s files cannot hold the copy ``header`` describes ("" when they can): the
        extra state is read and checked against its hash here (and kept: ``load`` parses those
        very bytes); the data is checked while ``load`` reads it (``hostread``)."""
        slot.verified = slot.verified_extra = None
        try:
            extra = read_private(slot.extra)
            fd = open_private(slot.data)
            try:
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
        except Rejected as exc:
            return str(exc)
        except OSError as exc:
            return f"cannot read it: {exc}"
        if size < layout.nbytes:
            return f"the data file holds {size} bytes, the layout {layout.nbytes}"
        if not hmac.compare_digest(_hash(extra, _keys(self.key)[0]), str(header.get("extra_hash"))):
            return "the extra state does not match its hash"
        slot.verified, slot.verified_extra, slot.verified_layout = header, extra, layout
        return ""

    def load(self, slot: _Slot, live: Any) -> tuple[Any, dict[str, Any]]:
        """Read ``slot``'s data into ``live``'s tensors, checking it against its hash as it is
        read (``hostread.read_checked``); returns the state to apply (``live``'s tensors within
        the saved structure) and the extra state. Raises when the copy does not check out (its
        data does not match its hash: ``Rejected``): ``live``'s tensors then hold NaN (or zeros),
        never part of a copy, and the caller restores from storage."""
        verified, extra, layout = slot.verified, slot.verified_extra, slot.verified_layout
        assert verified is not None and extra is not None and layout is not None, (
            "load() of a slot that find() did not return"
        )
        rest = load_plain(extra)
        tensors = [t for _, t in _leaves(live)]
        placed = 0

        def place(value: Any) -> Any:  # the placeholder's live tensor, in the order both are walked
            nonlocal placed
            if not isinstance(value, torch.Tensor):
                return value
            placed += 1
            return tensors[placed - 1] if placed <= len(tensors) else value

        state = _map(rest["skeleton"], place)
        if placed != len(tensors) or len(layout.leaves) != len(tensors):
            raise ValueError(f"the copy has {placed} tensors, the live state {len(tensors)}")
        read_checked(
            slot.data,
            [(leaf.offset, leaf.nbytes) for leaf in layout.leaves],
            layout.nbytes,
            [_local(t) for t in tensors],
            key=_keys(self.key)[0],
            digest=str(verified.get("data_hash")),
        )
        with self.lock:
            self.layout = layout  # (``prepare`` then keeps the slot's step: ``stage`` spares it)
            slot.step = int(verified["step"])
        return state, rest["extra"]


def in_background(work: Any, *args: Any, name: str) -> threading.Event:
    """Run ``work(*args)`` in a daemon thread; the event is set when it has ended (an error is
    dropped: the save that needs the result does the work again, and raises there). The process
    waits for it at exit: torch aborts a process that exits during such a thread's copy."""
    done = threading.Event()
    # A new thread's current GPU is GPU 0, not this rank's: CUDA work there would make a context
    # on another rank's GPU.
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None  # type: ignore[no-untyped-call]

    def run() -> None:
        try:
            with contextlib.suppress(Exception):
                if device is not None:
                    torch.cuda.set_device(device)
                work(*args)
        finally:
            done.set()

    atexit.register(done.wait, 120.0)
    threading.Thread(target=run, daemon=True, name=name).start()
    return done


_COPIES: dict[tuple[str, str, int, int, bytes], HostCopy] = {}
"""Per (folder, run id, rank, world size, key): a process keeps its slots mapped (and pinned)
across in-process restarts."""


def host_copy(folder: Path, *, run_id: str, rank: int, world: int, key: bytes) -> HostCopy:
    name = (str(folder), run_id, rank, world, key)
    copy = _COPIES.get(name)
    if copy is None:
        copy = _COPIES[name] = HostCopy(folder, run_id=run_id, rank=rank, world=world, key=key)
    return copy

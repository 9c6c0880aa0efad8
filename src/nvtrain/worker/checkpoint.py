"""Sharded, asynchronous, all-or-nothing checkpoints of model and optimizer state.

Layout of one run (``<checkpoint dir>/<run id>/``)::

    step-000120/                 a committed checkpoint: only ever appears whole (renamed)
        __0_0.distcp ...         torch.distributed.checkpoint shards, one set per rank
        .metadata                written by the coordinator once every rank's shards are written
        extra-rank0.pt ...       per-rank state: RNG states, data-loader position, user extras
        manifest-rank0.json ...  per-rank list of files with size and xxh3 digest
        COMMITTED                written last, lists every file; then the folder is renamed
    step-000140.partial-ab12cd/  a save in flight, or one whose writer died: never restored
    step-000100.rejected-ef34ab/ a step folder found corrupt or without COMMITTED: moved aside

A save: wait for the previous save to be committed; stage the state into host memory (the only
part that blocks training); write in the background (a separate gloo group, so the background
collectives never meet the training loop's); each rank writes its manifest; rank 0 waits for
all manifests, writes COMMITTED and renames the folder; when that step's folder already
exists, it is kept only if it verifies (the fresh save is then dropped), else it is rejected
and the fresh save takes its place. Restore picks the newest committed checkpoint of this run
whose files all match their manifests, and rejects (rank 0 moves aside, once every rank agreed)
the newer ones that do not and the step folders without COMMITTED, so no later save or
retention takes them for good ones. Nothing read back is unpickled with code (``plain``): a
checkpoint whose ``extra-rank*.pt``, ``.metadata`` or shards name anything but plain data is
rejected like a corrupt one. Retention keeps the checkpoint just committed (verified by
construction) and the ``keep - 1`` committed ones before it; newer folders are neither counted
nor deleted.

A save that fails for a storage error (``OSError``: a full or read-only volume, an I/O error) on
any rank is dropped, never committed: the ranks agree on it in ``wait`` (the next save's, or
``close``), rank 0 removes its partial folder (freeing what it took), logs one
``checkpoint_failed`` event and writes one line to stderr, and training goes on; the next save is
tried as usual. Failures in a row do not escalate: a run without new checkpoints still trains,
and ``checkpoint_failed`` says how many saves in a row failed. Any other error is raised on the
rank where it happened, as before.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import io
import json
import os
import random
import re
import secrets
import shutil
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from nvtrain.config.schema import Checkpoint as CheckpointPolicy
from nvtrain.events import Event, EventLog
from nvtrain.events.records import (
    CheckpointAlreadyCommitted,
    CheckpointBegin,
    CheckpointCommitted,
    CheckpointCorrupt,
    CheckpointFailed,
    CheckpointPartial,
    CheckpointRejected,
    CheckpointRestored,
    CheckpointSettled,
    CheckpointStaged,
)
from nvtrain.worker.hostcopy import ENV as HOST_COPY_ENV
from nvtrain.worker.hostcopy import HostCopy, Layout, Unsupported, host_copy, in_background, usable
from nvtrain.worker.peercopy import PeerCopies
from nvtrain.worker.peercopy import enabled as peer_copies_possible
from nvtrain.worker.plain import (
    MetadataReader,
    PlainLoadPlanner,
    Refused,
    check_plain,
    first_cause,
    load_plain,
    read_metadata,
    refusal,
)
from nvtrain.worker.settings import say

__all__ = ["Checkpointer", "CorruptCheckpoint", "committed_steps"]

COMMITTED = "COMMITTED"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_PARTIAL_DIR = re.compile(r"^step-(\d+)\.partial-[0-9a-f]+$")
_REJECTED_DIR = re.compile(r"^step-(\d+)\.rejected-[0-9a-f]+$")
_CHUNK = 8 << 20


class CorruptCheckpoint(RuntimeError):
    """A committed checkpoint whose files do not match their manifests."""


def _digest(path: Path) -> str:
    """xxh3-64 of a file (hex): what a manifest records since the format checked at 15 GB/s;
    zlib's CRC-32 took about 1 s per GB, on the path to every commit."""
    import xxhash

    hasher = xxhash.xxh3_64()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def _crc(path: Path) -> int:
    """CRC-32 of a file: what manifests written before ``_digest`` hold."""
    crc = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(path: Path, data: bytes) -> None:
    """Write ``data`` to disk, then make it appear at ``path`` in one rename, the last thing done
    in that folder. A rank's manifest is published this way: once every rank's is there, rank 0
    commits and renames the partial folder, so a rank must not touch the old path afterwards (an
    fsync of the folder there failed with ENOENT under load, and a committed save was reported
    failed). The manifests' names become durable when rank 0 fsyncs the folder (``_write_durable``
    of COMMITTED), which it does after reading them all and before the rename that commits."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _write_durable(path: Path, data: bytes) -> None:
    _publish(path, data)
    _fsync_dir(path.parent)


def _storage_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind ``exc`` (a full, read-only or failing volume), if there is one."""
    return first_cause(exc, OSError, unless=(ConnectionError,))


def _os_error_text(exc: OSError) -> str:
    """``No space left on device (ENOSPC): /path`` (the path when the error names one)."""
    code = errno.errorcode.get(exc.errno or 0, "")
    text = (exc.strerror or str(exc)) + (f" ({code})" if code else "")
    return text + (f": {exc.filename}" if exc.filename else "")


_Failure = tuple[str, str, str]
"""A rank's failed part of a save: (what went wrong, in one line; the errno's name or ""; kind:
``storage``, ``peer`` (written here, failed elsewhere) or ``other`` (raised on its rank))."""
_KINDS = ("storage", "other", "peer")
"""Which rank's failure a report names first."""


_WRITER_THREAD = "_write_files_from_queue"
"""The function torch's extra checkpoint writer threads run (``write_threads`` > 1)."""


def _quiet_writer_threads() -> None:
    """A storage error in one of torch's extra writer threads is reported once, as the save's
    failure (``checkpoint_failed``, one line on stderr): keep Python from also printing the
    thread's traceback. Any other exception, or any other thread, is printed as before."""
    previous = threading.excepthook
    if getattr(previous, "_nvtrain", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else ""
        if _WRITER_THREAD in name and args.exc_value is not None and _storage_error(args.exc_value):
            return
        previous(args)

    hook._nvtrain = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class _WatchedFileSystem(FileSystem):
    """torch's file system for checkpoint shards, keeping the ``OSError`` behind a failed write:
    torch's stream writer turns a full volume into a ``RuntimeError``, and torch hands a rank's
    error to the others pickled, without its cause."""

    def __init__(self, errors: list[OSError]) -> None:
        super().__init__()
        self.errors = errors

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        try:
            with super().create_stream(path, mode) as stream:
                yield stream
        except BaseException as exc:
            cause = _storage_error(exc)
            if cause is not None:
                self.errors.append(cause)
            raise


def committed_steps(run_dir: Path) -> list[int]:
    """Steps of the committed checkpoints in ``run_dir``, oldest first."""
    steps = []
    if run_dir.is_dir():
        for entry in run_dir.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match and (entry / COMMITTED).is_file():
                steps.append(int(match.group(1)))
    return sorted(steps)


def _step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / f"step-{step:06d}"


def _rng_state() -> dict[str, Any]:
    """The RNG states as plain data (what ``torch.load(weights_only=True)`` reads back): numpy's
    ``get_state()`` tuple holds an array, kept here as a list of its integers."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    with contextlib.suppress(ImportError):
        import numpy

        kind, keys, pos, has_gauss, gauss = numpy.random.get_state()
        state["numpy"] = {
            "kind": str(kind),
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        }
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        with contextlib.suppress(ImportError):
            import numpy

            saved = state["numpy"]
            if isinstance(saved, dict):
                keys = numpy.array(saved["keys"], dtype=numpy.uint32)
                saved = (saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["gauss"])
            numpy.random.set_state(saved)  # (a tuple: written before plain RNG states)


def _nbytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if hasattr(state, "_local_tensor"):
        return _nbytes(state._local_tensor)
    if isinstance(state, dict):
        return sum(_nbytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(_nbytes(v) for v in state)
    return 0


class _ReusedBufferStager:
    """Stages a state dict into host buffers allocated once and reused by every later save.

    On a GPU the buffers are pinned and the copies are non-blocking, followed by one
    synchronisation: the training loop is blocked for about state bytes / pinned device-to-host
    bandwidth. The next save starts only after the previous one is written, so reusing the
    buffers is safe. (Implements torch's ``AsyncStager`` protocol; the returned dict goes to
    ``async_save`` as it is.)
    """

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buffer: Any = None
        self.last_staged: Any = None
        self.signature: Any = None

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    @staticmethod
    def _signature(state: Any) -> Any:
        if isinstance(state, dict):
            return tuple((k, _ReusedBufferStager._signature(v)) for k, v in state.items())
        if isinstance(state, list | tuple):
            return tuple(_ReusedBufferStager._signature(v) for v in state)
        if isinstance(state, torch.Tensor):
            local = state.to_local() if hasattr(state, "to_local") else state
            return (tuple(local.shape), local.dtype)
        return type(state).__name__

    def stage(self, state_dict: Any) -> Any:
        from torch.distributed._state_dict_utils import _copy_state_dict

        cuda = torch.cuda.is_available()
        self.prepare(state_dict)
        staged = _copy_state_dict(state_dict, self.buffer, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize()
        self.last_staged = staged
        return staged

    def synchronize_staging(self) -> None:
        return None

    def prepare(self, state_dict: Any) -> None:
        """Allocate (and pin) the buffers for ``state_dict`` now, not at the first save."""
        from torch.distributed._state_dict_utils import _create_cpu_state_dict

        signature = self._signature(state_dict)
        with self.lock:
            if self.buffer is None or signature != self.signature:
                self.buffer = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
                self.signature = signature

    def close(self) -> None:
        self.buffer = self.last_staged = None


@dataclasses.dataclass
class _Held:
    """The staged copy of this rank's newest written checkpoint, kept in host memory."""

    step: int
    state: Any
    extra: dict[str, Any]


_IN_MEMORY: dict[str, _Held] = {}
"""Per run directory; survives in-process restarts (same process), not process restarts."""

_SAID: set[str] = set()
"""Lines said once per process (not once per in-process attempt)."""


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        say(message)


_PLACING = threading.Lock()
"""Held while rank 0 puts a commit in place: an earlier attempt's background commit (after an
in-process restart) and the new attempt's may meet on the same step."""


class _Save:
    """One save in flight."""

    def __init__(
        self,
        step: int,
        folder: Path,
        future: concurrent.futures.Future[Any] | None,
        held: _Held | None = None,
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
        """Storage errors torch met writing this rank's shards (see ``_WatchedFileSystem``)."""
        self.step = step
        self.folder = folder
        self.future = future
        self.inline = inline
        """A sync save: rank 0 commits in ``wait``, once every rank's part is known to be written."""
        self.written = threading.Event()
        """This rank's files and manifest are written, or failed (``error``)."""
        self.cancelled = False
        """Another rank's part failed: rank 0 stops waiting for its manifest, commits nothing."""
        self.done = threading.Event()
        self.error = error
        self.started = time.monotonic()
        self.settling = False
        self.settled = threading.Event()
        self.sealed = threading.Event()
        """The header of this save's host copy is written (or will not be): set before
        ``written``."""


class Checkpointer:
    """Saves and restores model + optimizer (+ extras) of one training attempt.

    Create one per attempt (after ``init_process_group``); call ``restore()`` once, then
    ``maybe_save(step)`` every step, and ``close()`` at the end. ``abort()`` drops a save in
    flight without committing it (in-process restart).
    """

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
            _quiet_writer_threads()
        """Threads (and files) per rank that torch's writer writes the shards with."""
        self.optimizer = optimizer
        self.run_dir = run_dir
        self.policy = policy
        self.events = events
        self.extra = extra or {}
        self._pause = pause
        self.pause_limit = pause_limit
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        # Background saves coordinate on their own group, never on the training loop's.
        self.group = dist.new_group(backend="gloo") if self.distributed else None
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
        return {"step": step, "world": self.world, "rng": _rng_state(), "extra": extras}

    def _broadcast_token(self) -> str:
        token = [secrets.token_hex(4)]
        if self.distributed:
            dist.broadcast_object_list(token, src=0, group=self.group)
        return str(token[0])

    # -- saving ----------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        return step % self.policy.interval == 0 and step != self.last_saved

    def maybe_save(self, step: int) -> bool:
        if not self.due(step):
            self.prepare()
            return False
        self.save(step)
        return True

    def save(self, step: int) -> None:
        """Checkpoint the state after ``step``. Blocks only while the state is staged (async)."""
        with self._paused():  # waiting for the previous save and staging are not a hang either
            self._save(step)

    def _save(self, step: int) -> None:
        t0 = time.monotonic()
        extra_state = self._extra_state(step)  # checked before anything is written
        self.wait()  # the previous save is finalized before the next starts
        waited = time.monotonic() - t0
        token = self._broadcast_token()
        folder = self.run_dir / f"step-{step:06d}.partial-{token}"
        # A storage error here is kept for wait(): this rank still takes part in the save's
        # collectives (torch's fail on every rank together), and the save is then dropped.
        failed: OSError | None = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            failed = exc
        self._emit(CheckpointBegin(step=step, waited_for_previous_s=round(waited, 6)))
        if self.host is None:
            _IN_MEMORY.pop(str(self.run_dir), None)  # the staging buffers are about to change
        else:
            self.host.keep = self.newest_committed  # its slot is kept; the other is restaged
        state = self._state()
        nbytes = _nbytes(state)
        if failed is None:
            buffer = io.BytesIO()  # written by Python, so that a full volume is an OSError
            torch.save(extra_state, buffer)
            try:
                (folder / f"extra-rank{self.rank}.pt").write_bytes(buffer.getbuffer())
            except OSError as exc:
                failed = exc
        t1 = time.monotonic()
        if self.policy.async_ and self.host is not None:
            self._prepare_host_copy(state)
        io_errors: list[OSError] = []
        writer = FileSystemWriter(str(folder), thread_count=self.write_threads)
        writer.fs = _WatchedFileSystem(io_errors)
        if self.policy.async_:
            response = dcp_async_save(
                state,
                checkpoint_id=str(folder),
                storage_writer=writer,
                process_group=self.group,
                async_stager=self._get_stager(),
            )
            future: Any = getattr(response, "upload_completion", response)
            staged = time.monotonic()
            held = None
            save = _Save(step, folder, future, held, error=failed, io_errors=io_errors, token=token)
            if isinstance(self.stager, HostCopy) and self.stager.last is not None:
                save.host_slot = (self.stager.last, self.stager.last.generation)
                save.held = _Held(step, None, extra_state)
            elif self.stager is not None:
                save.held = _Held(step, self.stager.last_staged, extra_state)
            # SIGTERM raises ``Stopped`` in this thread between any two statements, waits
            # included (``Thread.start`` waits for the thread): whatever it interrupts here, the
            # save that torch is writing is in flight and finished by its thread, so that the
            # stop's settle waits for it and commits it.
            # (Staged is logged before the thread starts, so it always comes before committed.)
            finisher = threading.Thread(
                target=self._finish, args=(save,), daemon=True, name=f"nvtrain-ckpt-{step}"
            )
            self.inflight = save
            self.last_saved = step
            try:
                self._emit(
                    CheckpointStaged(
                        step=step,
                        blocked_s=round(staged - t0, 6),
                        stage_s=round(staged - t1, 6),
                        bytes=nbytes,
                        is_async=True,
                    )
                )
            finally:
                self.inflight = save
                self.last_saved = step
                finisher.start()
            return
        # Sync: the loop waits for the write, the manifests and the commit. ``write_s`` is
        # that part; ``blocked_s`` is all of it.
        with self._paused():
            save = _Save(step, folder, None, error=failed, io_errors=io_errors, inline=True, token=token)
            try:
                dcp_save(state, checkpoint_id=str(folder), storage_writer=writer, process_group=self.group)
            except (Exception, CheckpointException) as exc:  # told, and dealt with, in wait()
                save.error = save.error or exc
            self._finish(save)
        self.inflight = save
        self.last_saved = step
        self.wait()
        done = time.monotonic()
        self._emit(
            CheckpointStaged(
                step=step,
                blocked_s=round(done - t0, 6),
                stage_s=round(t1 - t0, 6),
                write_s=round(done - save.started, 6),
                bytes=nbytes,
                is_async=False,
            )
        )

    def _prepare_host_copy(self, state: dict[str, Any]) -> None:
        """Map the host copy's slots for ``state`` (at once when the background preparation did);
        a folder without room for them (a small ``/dev/shm``) or a state it cannot hold turns
        the copy off for this process, said once: saves then stage into process memory."""
        assert self.host is not None
        try:
            self.host.ready.wait()
            self.host.prepare(state)
        except (OSError, Unsupported) as exc:
            say(
                f"cannot keep the host copy in {self.host.folder}: {exc}; saves go on without it, and "
                "a replaced worker restores from storage (give the pod's /dev/shm 2 x the state per "
                "rank, or set [checkpoint] memory_dir)"
            )
            self.host.broken = True
            self.host.release()
            self.host = None
            self.stager = None

    def _get_stager(self) -> Any:
        if self.stager is None:
            self.stager = self.host if self.host is not None else _ReusedBufferStager()
        return self.stager

    def _finish(self, save: _Save) -> None:
        """Background (inline for a sync save): seal this rank's host copy, wait for this rank's
        write, write its manifest; rank 0 then commits (a sync save's commit waits for
        ``wait``). Never raises: an error is kept in ``save.error`` for ``wait``."""
        try:
            self._seal(save)
        finally:
            save.sealed.set()
            if self.peers is not None and not save.inline:
                sealed = save.host_slot if save.error is None and not self.aborted else None
                self.peers.submit(save.step, save.token, self.host, sealed)
        try:
            if save.future is not None:
                save.future.result()
            if save.io_errors and save.error is None:
                # One of torch's extra writer threads died of it (write_threads > 1): torch does
                # not raise, and its checkpoint would lack that thread's files.
                save.error = save.io_errors[0]
            if save.error is None and not self.aborted:
                self._write_manifest(save)
        except BaseException as exc:  # reported by wait(); never kills the trainer thread
            save.error = save.error or exc
        finally:
            save.written.set()
        if not save.inline:
            self._commit_once(save)

    def _seal(self, save: _Save) -> None:
        """Hash this save's host copy and write its header while the shards are written: the
        copy is then sealed on every rank before any manifest, so a committed step always has
        its copy. (A header of a save that is never committed names a token that no COMMITTED
        file holds: it is never used.) Never raises."""
        if save.host_slot is None or save.error is not None or save.held is None or self.aborted:
            return
        slot, generation = save.host_slot
        try:
            assert self.host is not None
            self.host.seal(slot, generation, step=save.step, token=save.token, extra=save.held.extra)
        except Exception as exc:  # the copy is only a faster restore: storage still has it
            say(f"host copy of step {save.step} not kept: {exc!r}")

    def _commit_once(self, save: _Save) -> None:
        """Rank 0 commits ``save`` unless it failed somewhere; every rank then marks it done."""
        try:
            if self.rank == 0 and save.error is None and not save.cancelled and not self.aborted:
                self._commit(save)
        except BaseException as exc:  # reported by wait(); never kills the trainer thread
            save.error = exc
        finally:
            save.done.set()

    def _write_manifest(self, save: _Save) -> None:
        mine = sorted(
            p
            for p in save.folder.iterdir()
            if p.is_file()
            and (
                p.name.startswith(f"__{self.rank}_")
                or p.name == f"extra-rank{self.rank}.pt"
                or (self.rank == 0 and p.name == ".metadata")
            )
        )
        # One thread per file, as many as wrote them: reading back and hashing is then no slower
        # than the write (one thread hashes about 1.5 GB/s of page cache; 4 in parallel, 4x that).
        with concurrent.futures.ThreadPoolExecutor(max(1, min(len(mine), self.write_threads))) as pool:
            digests = list(pool.map(_digest, mine))
        manifest = {p.name: {"size": p.stat().st_size, "xxh3": d} for p, d in zip(mine, digests, strict=True)}
        _publish(
            save.folder / f"manifest-rank{self.rank}.json", json.dumps(manifest, sort_keys=True).encode()
        )
        if save.held is not None and save.held.state is not None and self.host is None:
            _IN_MEMORY[str(self.run_dir)] = save.held

    def _commit(self, save: _Save) -> None:
        deadline = time.monotonic() + 600.0
        names = [f"manifest-rank{r}.json" for r in range(self.world)]
        while not all((save.folder / n).is_file() for n in names):
            if self.aborted or save.cancelled:
                return
            if time.monotonic() > deadline:
                missing = [n for n in names if not (save.folder / n).is_file()]
                raise TimeoutError(
                    errno.ETIMEDOUT, f"{', '.join(missing)} not written within 600 s", str(save.folder)
                )
            time.sleep(0.05)
        files: dict[str, Any] = {}
        for name in names:
            files.update(json.loads((save.folder / name).read_text()))
        _write_durable(
            save.folder / COMMITTED,
            json.dumps(
                {"step": save.step, "world": self.world, "token": save.token, "files": files}, sort_keys=True
            ).encode(),
        )
        final = _step_dir(self.run_dir, save.step)
        with _PLACING:
            # The same step may be on storage already: committed by an earlier attempt (kept when
            # it verifies), or a damaged folder (rejected, and this save takes its place).
            existed = final.exists()
            problem = self._verify(final, save.step, whole=True) if existed else None
            kept = existed and problem is None
            if kept:
                shutil.rmtree(save.folder, ignore_errors=True)
                _IN_MEMORY.pop(str(self.run_dir), None)  # memory now differs from what is committed
            else:
                if problem is not None:
                    self._reject(final, save.step, problem)
                os.rename(save.folder, final)
                _fsync_dir(self.run_dir)
        if kept:
            self._emit(CheckpointAlreadyCommitted(step=save.step, path=str(final)))
        else:
            self._emit(
                CheckpointCommitted(
                    step=save.step,
                    write_s=round(time.monotonic() - save.started, 6),
                    bytes=sum(int(f["size"]) for f in files.values()),
                )
            )
        with contextlib.suppress(OSError):  # retention is tried again after the next commit
            self._retain(save.step)

    def _reject(self, folder: Path, step: int, problem: str) -> None:
        """Rank 0: move a damaged step folder aside, so it is never restored, kept as a commit
        or counted by retention (``_retain`` deletes it once a later step is committed); one
        line says what was wrong."""
        aside = folder.with_name(f"{folder.name}.rejected-{secrets.token_hex(4)}")
        try:
            os.rename(folder, aside)
            _fsync_dir(folder.parent)
        except OSError as exc:  # a read-only volume: restore skips it all the same
            error = _os_error_text(exc)
            event = CheckpointRejected(step=step, path=str(folder), problem=problem, error=error)
        else:
            event = CheckpointRejected(step=step, path=str(folder), moved_to=str(aside), problem=problem)
        self._emit(event)
        say(f"checkpoint rejected: {event.text}")

    def _retain(self, newest: int) -> None:
        """``newest`` was just committed (or verified) here: keep it and the ``keep - 1``
        committed checkpoints before it. Newer step folders were not verified by this run, so
        they are neither counted (a damaged one would push out the last good checkpoint) nor
        deleted. Partial and rejected folders older than ``newest`` are removed."""
        older = [step for step in committed_steps(self.run_dir) if step < newest]
        for step in older[: max(len(older) - (self.policy.keep - 1), 0)]:
            shutil.rmtree(_step_dir(self.run_dir, step), ignore_errors=True)
        for entry in self.run_dir.iterdir():
            match = _PARTIAL_DIR.match(entry.name) or _REJECTED_DIR.match(entry.name)
            if match and int(match.group(1)) < newest:
                shutil.rmtree(entry, ignore_errors=True)

    def wait(self) -> None:
        """Block until the save in flight is written and (rank 0) committed, or has failed.

        Every rank calls it (before each save, and in ``close``): the ranks first tell each
        other whether their part was written, so rank 0 never waits for a part that will not
        come, then learn from rank 0 whether it committed. A failed save is dropped (see the
        module's docstring); an error other than a storage error is raised here, on its rank."""
        save, self.inflight = self.inflight, None
        if save is None:
            return
        with self._paused():
            save.written.wait()
            failures = {r: f for r, f in enumerate(self._all_gather(self._failure(save))) if f}
            save.cancelled = bool(failures)
            if save.inline:
                self._commit_once(save)
            save.done.wait()
            if not failures:  # rank 0's commit: every rank knows it is done (or failed)
                committed = self._from_rank0(self._failure(save))
                failures = {0: committed} if committed else {}
        if not failures:
            self.failed_in_a_row = 0
            self.newest_committed = save.step
            return
        self._dropped(save, failures)
        mine = failures.get(self.rank)
        if mine is not None and mine[2] == "other" and save.error is not None:
            raise save.error

    def _failure(self, save: _Save) -> _Failure | None:
        """This rank's part of ``save`` in one line; None when it was written (and committed)."""
        exc = save.error
        if exc is None:
            return None
        cause = save.io_errors[0] if save.io_errors else _storage_error(exc)
        if cause is not None:
            return _os_error_text(cause), errno.errorcode.get(cause.errno or 0, ""), "storage"
        if isinstance(exc, CheckpointException) and self.rank not in exc.failures:
            return "written here, failed on another rank", "", "peer"
        return repr(exc)[:300].replace("\n", " "), "", "other"

    def _all_gather(self, failure: _Failure | None) -> list[_Failure | None]:
        if not self.distributed:
            return [failure]
        everyone: list[_Failure | None] = [None] * self.world
        dist.all_gather_object(everyone, failure, group=self.group)
        return everyone

    def _from_rank0(self, failure: _Failure | None) -> _Failure | None:
        if not self.distributed:
            return failure
        box = [failure]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _dropped(self, save: _Save, failures: dict[int, _Failure]) -> None:
        """Every rank: forget the failed save; rank 0 also removes its partial folder, which may
        hold most of a checkpoint's bytes on a full volume, and reports it once."""
        self.failed_in_a_row += 1
        held = _IN_MEMORY.get(str(self.run_dir))
        if held is not None and held.step == save.step:
            _IN_MEMORY.pop(str(self.run_dir), None)
        if self.host is not None:
            self.host.forget(save.step)
        if self.rank != 0:
            return
        shutil.rmtree(save.folder, ignore_errors=True)  # nobody writes to it any more
        named = min(failures, key=lambda r: (_KINDS.index(failures[r][2]), r))
        text, code, kind = failures[named]
        ranks = sorted(r for r, f in failures.items() if f[2] != "peer") or sorted(failures)
        self._emit(
            CheckpointFailed(
                step=save.step,
                error=text,
                errno=code,
                ranks=tuple(ranks),
                path=str(save.folder),
                failed_in_a_row=self.failed_in_a_row,
            )
        )
        where = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        newest = "none yet" if self.newest_committed is None else f"step {self.newest_committed}"
        if kind != "other":
            then = (
                f"training goes on; the next save tries again ({self.failed_in_a_row} failed in a row; "
                f"newest checkpoint: {newest})"
            )
        else:
            then = f"the error is raised on {where}"
        say(f"checkpoint of step {save.step} not saved ({where}): {text}; {then}")

    def close(self) -> None:
        self.wait()
        if self.peers is not None:
            # The last save's copy is being exchanged: the peers wait for this rank's part.
            self.peers.drain(60.0)
        if self.stager is not None:
            with contextlib.suppress(Exception):
                self.stager.close()
            self.stager = None

    def settle(self, limit: float) -> bool:
        """A soft fault is being handled: give the save in flight up to ``limit`` seconds to be
        written (and, on rank 0, committed) before the collectives are aborted, so the restart
        resumes from it rather than from the checkpoint before. Called on every rank before
        ``abort``; waits once per save and never raises. True when the save finished."""
        save = self.inflight
        if save is None or self.aborted:
            return False
        with self._settle_lock:
            first, save.settling = not save.settling, True
        if not first:
            # The failing rank's main thread and NVRx's abort thread both get here: the second
            # must not let the collectives be aborted while the first still waits.
            save.settled.wait(max(0.0, limit))
            return False
        t0 = time.monotonic()
        try:
            finished = save.done.wait(max(0.0, limit)) and save.error is None
        finally:
            save.settled.set()
        self._emit(
            CheckpointSettled(
                step=save.step, waited_s=round(time.monotonic() - t0, 6), finished=finished, limit_s=limit
            )
        )
        return finished

    def abort(self) -> None:
        """Forget the save in flight: if it has not finished, it is never committed (called on
        in-process restart, after ``settle``)."""
        self.aborted = True
        self.inflight = None
        if self.peers is not None:
            self.peers.stop()

    # -- restoring -------------------------------------------------------------------------
    def _verify(self, folder: Path, step: int, *, whole: bool = False) -> str | None:
        """None when the files listed in COMMITTED match (this rank's share of them, or all of
        them with ``whole``) and COMMITTED is for ``step``; else what is wrong."""
        try:
            committed = json.loads((folder / COMMITTED).read_text())
            listed, committed_step = committed["files"], committed["step"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"unreadable {COMMITTED}: {exc}"
        if committed_step != step:
            return f"{COMMITTED} is for step {committed_step!r}"
        names = sorted(listed)
        for name in names if whole else names[self.rank :: self.world]:
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != listed[name]["size"]:
                return f"{name} has {path.stat().st_size} bytes, expected {listed[name]['size']}"
            entry = listed[name]
            if ("xxh3" in entry and _digest(path) != entry["xxh3"]) or (
                "xxh3" not in entry and _crc(path) != entry.get("crc32")
            ):
                return f"{name} does not match its manifest's digest"
        return None

    def _first_problem(self, problem: str | None) -> str | None:
        """Every rank: the first rank's problem with a checkpoint (naming the rank when there
        are several), or None when every rank found none."""
        if not self.distributed:
            return problem
        everyone: list[str | None] = [None] * self.world
        dist.all_gather_object(everyone, problem, group=self.group)
        found = [(rank, p) for rank, p in enumerate(everyone) if p is not None]
        return None if not found else f"{found[0][1]} (found by rank {found[0][0]})"

    def _read_plain(self, folder: Path) -> tuple[str | None, dict[str, Any] | None]:
        """This rank's extra state of the checkpoint in ``folder`` read as plain data, and rank
        0's check of DCP's ``.metadata`` (every rank reads it through ``MetadataReader`` too):
        (what was refused, the extra state)."""
        name = f"extra-rank{self.rank}.pt"
        extra = None
        try:
            if (folder / name).is_file():
                extra = load_plain(folder / name, legacy_numpy=True, what=name)
            if self.rank == 0:
                with (folder / ".metadata").open("rb") as stream:
                    read_metadata(stream)
        except Refused as exc:
            return str(exc), None
        except OSError as exc:
            return f"cannot read it: {_os_error_text(exc)}", None
        if extra is not None and not isinstance(extra, dict):
            return f"{name} holds a {type(extra).__name__}, not the extra state", None
        return None, extra

    def restore(self) -> int:
        """Load the newest intact committed checkpoint of this run; returns its step (0: none)."""
        t0 = time.monotonic()
        if self.rank == 0 and self.run_dir.is_dir():
            for entry in sorted(self.run_dir.iterdir()):
                match = _STEP_DIR.match(entry.name)
                if match and not (entry / COMMITTED).is_file():  # a commit is renamed in whole
                    self._reject(entry, int(match.group(1)), f"no {COMMITTED} file")
        steps = self._agreed_steps()
        newest_committed = max(steps, default=0)
        if self.rank == 0 and self.run_dir.is_dir():
            for entry in sorted(self.run_dir.iterdir()):
                match = _PARTIAL_DIR.match(entry.name)
                if match and int(match.group(1)) > newest_committed:
                    self._emit(CheckpointPartial(path=str(entry), step=int(match.group(1))))
        if self._restore_from_memory(newest_committed, t0):
            return newest_committed
        return self._restore_from_storage(steps, t0)

    def prepare(self) -> threading.Event | None:
        """Map and pin the buffers of the next save in the background once the state's layout
        is known (the optimizer has state: reading it earlier would create it, a step of its
        own): the first save then blocks no longer than the later ones. ``maybe_save`` calls it
        on steps that are not due; a no-op after the first time. Returns an event set once the
        buffers are ready (None when nothing was started)."""
        if self.prepared or not self.policy.async_:
            return None
        if self.optimizer is not None and not self.optimizer.state:
            return None
        self.prepared = True
        try:
            state = self._state()
        except Exception:  # noqa: BLE001 - the first save prepares them, and raises there
            return None
        stager = self._get_stager()
        if isinstance(stager, HostCopy):
            stager.prepare_in_background(state)
            return stager.ready
        return in_background(stager.prepare, state, name="nvtrain-stager")

    def _restore_from_storage(self, steps: list[int], t0: float) -> int:
        with self._paused():
            for step in reversed(steps):
                folder = _step_dir(self.run_dir, step)
                problem = self._verify(folder, step)
                extra = None
                if problem is None:
                    problem, extra = self._read_plain(folder)
                problem = self._first_problem(problem)
                if problem is None:
                    try:
                        self._load(folder, extra)
                    except (Exception, CheckpointException) as exc:
                        refused = refusal(exc)
                        if refused is None:
                            raise
                        problem = f"{refused} (read by torch's loader)"  # every rank raised it
                if problem is not None:
                    self._emit(CheckpointCorrupt(step=step, path=str(folder), problem=problem))
                    if self.rank == 0:  # every rank is done with it (the all-gather above)
                        self._reject(folder, step, problem)
                    continue
                self.last_saved = self.newest_committed = step
                self._emit(
                    CheckpointRestored(
                        step=step,
                        origin="storage",
                        seconds=round(time.monotonic() - t0, 6),
                        bytes=self._state_bytes(),
                        memory_problem=self.memory_problem,
                    )
                )
                return step
        return 0

    def _state_bytes(self) -> int:
        """Bytes of this rank's model + optimizer state (what a restore brought back)."""
        with contextlib.suppress(Exception):
            return _nbytes(self._state())
        return 0

    def _agreed_steps(self) -> list[int]:
        """The committed steps as rank 0 sees them, so every rank tries the same list (a
        commit landing between two ranks' listings would otherwise split them)."""
        steps = [committed_steps(self.run_dir)]
        if self.distributed:
            dist.broadcast_object_list(steps, src=0, group=self.group)
        return list(steps[0])

    def _restore_from_memory(self, newest: int, t0: float) -> bool:
        """After an in-process restart every rank may still hold the staged copy of the newest
        committed checkpoint: then load it from host memory instead of storage."""
        if self.host is not None or self.peers is not None:
            return self._restore_from_host(newest, t0)
        held = _IN_MEMORY.get(str(self.run_dir)) if self.policy.in_memory else None
        mine = held is not None and newest > 0 and held.step == newest
        if not self._everyone(mine) or held is None:
            return False
        from torch.distributed._state_dict_utils import _copy_state_dict

        live = self._state()
        restored = _copy_state_dict(held.state, live, non_blocking=torch.cuda.is_available())
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._apply(restored, held.extra)
        self.last_saved = self.newest_committed = newest
        self._emit(
            CheckpointRestored(
                step=newest, origin="memory", seconds=round(time.monotonic() - t0, 6), bytes=_nbytes(live)
            )
        )
        return True

    def _everyone(self, mine: bool) -> bool:
        """True when ``mine`` is true on every rank."""
        if not self.distributed:
            return mine
        flag = torch.tensor([1 if mine else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def _restore_from_host(self, newest: int, t0: float) -> bool:
        """Load the host copy of the newest committed checkpoint that this pod's files hold (see
        ``hostcopy``), when every rank has a good one; ranks of a replaced pod first get theirs
        from the pod that kept it (``peercopy``). Else note why for the storage restore."""
        slot, why, origin = None, "no checkpoint committed yet", "memory"
        live: Any = None
        token: str | None = None
        if newest > 0:
            with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
                committed = json.loads((_step_dir(self.run_dir, newest) / COMMITTED).read_text())
                token = committed.get("token")
            try:
                live = self._state()
                if self.host is None:
                    why = "this rank keeps no host copy"
                else:
                    slot, why = self.host.find(step=newest, token=token, state=live)
            except Unsupported as exc:
                why = str(exc)
        if self.peers is not None and newest > 0:
            slot, why, origin = self._from_peer(newest, token, live, slot, why)
        agreed = self._everyone(slot is not None)
        if not agreed or slot is None:
            self.memory_problem = why or "another rank has no usable copy"
            return False
        assert self.host is not None
        failed = ""
        try:
            state, extra = self.host.load(slot, live)
            self._apply(state, extra)
        except Exception as exc:  # noqa: BLE001 - every rank then reads storage, which overwrites it all
            failed = f"loading it failed: {exc!r}"[:300]
        if not self._everyone(not failed):
            self.memory_problem = failed or "loading it failed on another rank"
            return False
        self.last_saved = self.newest_committed = newest
        self._emit(
            CheckpointRestored(
                step=newest, origin=origin, seconds=round(time.monotonic() - t0, 6), bytes=_nbytes(live)
            )
        )
        return True

    def _from_peer(
        self, step: int, token: str | None, live: Any, slot: Any, why: str
    ) -> tuple[Any, str, str]:
        """Every rank: the ranks without a copy of their own get theirs from the rank that kept
        it, when every one of them can. Returns this rank's (slot, why not, origin)."""
        assert self.peers is not None
        peers = self.peers
        needing, problem = peers.plan(slot is not None, peers.holds(step=step, token=token), self.group)
        if not needing:
            return slot, why, "memory"
        if problem:
            return slot, f"{why}; {problem}" if why else problem, "memory"
        try:
            layout = Layout.of(live) if live is not None else None
            got, problem = peers.bring_back(needing, self.host, layout)
        except Exception as exc:  # noqa: BLE001 - every rank then reads storage
            got, problem = None, f"receiving it failed: {exc!r}"[:300]
        if self.rank not in needing:
            return slot, why, "memory"
        if got is None or self.host is None:
            return None, problem or "no copy came from the peer", "peer"
        slot, why = self.host.find(step=step, token=token, state=live)
        return slot, (f"the copy rank {peers.buddy} kept: {why}" if why else ""), "peer"

    def _apply(self, state: dict[str, Any], extra: dict[str, Any] | None) -> None:
        if self.optimizer is not None:
            set_state_dict(
                self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )
        else:
            set_state_dict(self.model, [], model_state_dict=state["model"], optim_state_dict={})
        if extra is not None:
            _set_rng_state(extra["rng"])
            for key, value in extra["extra"].items():
                target = self.extra.get(key)
                if target is not None and hasattr(target, "load_state_dict"):
                    target.load_state_dict(value)

    def _load(self, folder: Path, extra: dict[str, Any] | None) -> None:
        """Load the shards in ``folder`` (nothing unpickled with code: ``plain``) and apply them
        with ``extra``, this rank's extra state as ``_read_plain`` read it."""
        state = self._state()
        dcp_load(
            state,
            checkpoint_id=str(folder),
            storage_reader=MetadataReader(str(folder)),
            planner=PlainLoadPlanner(),
            process_group=self.group,
        )
        self._apply(state, extra)

"""The save protocol: from a due step to a committed (or dropped) checkpoint.

A save: wait for the previous save to be committed; stage the state into host memory (the only
part that blocks training); write in the background (a separate gloo group, so the background
collectives never meet the training loop's); each rank writes its manifest; rank 0 waits for
all manifests, writes COMMITTED and renames the folder; when that step's folder already
exists, it is kept only if it verifies (the fresh save is then dropped), else it is rejected
and the fresh save takes its place. Retention then runs (``layout.retain``).

Owns when a save is due, the save in flight (``wait``, ``settle`` before an in-process restart,
``abort``, ``close``), the background finisher (host-copy seal, manifest, commit) and what the
ranks do with a failed save (``failures``). The names and rules of the files are ``layout``'s.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import threading
import time
from typing import Any, NoReturn

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from nvtrain.events.records import (
    CheckpointAlreadyCommitted,
    CheckpointBegin,
    CheckpointCommitted,
    CheckpointSettled,
    CheckpointStaged,
)
from nvtrain.private import NotPrivate
from nvtrain.worker.checkpoint import layout, runfolder, staging
from nvtrain.worker.checkpoint.core import CheckpointerCore, _Save
from nvtrain.worker.checkpoint.failures import Failure, WatchedFileSystem, dropped, failure
from nvtrain.worker.hostcopy import HostCopy, Unsupported, in_background
from nvtrain.worker.settings import say

__all__ = ["Saving"]

_PLACING = threading.Lock()
"""Held while rank 0 puts a commit in place: an earlier attempt's background commit (after an
in-process restart) and the new attempt's may meet on the same step."""


class _Refused(WatchedFileSystem):
    """torch's file system for a save into a run folder that failed ``runfolder.check_run_dir``:
    every write fails with that error, so the save fails on every rank together and nothing is
    written at that path."""

    def __init__(self, errors: list[OSError], refusal: NotPrivate) -> None:
        super().__init__(errors)
        self.refusal = refusal

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        raise self.refusal

    def create_stream(self, path: str | os.PathLike[str], mode: str) -> NoReturn:
        raise self.refusal


class Saving(CheckpointerCore):
    """The saving half of the ``Checkpointer``."""

    _run_dir_seen: tuple[int, int] | None = None
    """The run folder's ``(st_dev, st_ino)`` when a save last checked it (``runfolder.check_run_dir``)."""

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
        token = self.ranks.token()
        folder = layout.partial_dir(self.run_dir, step, token)
        # A storage error here is kept for wait(): this rank still takes part in the save's
        # collectives (torch's fail on every rank together), and the save is then dropped.
        failed: OSError | None = None
        refused: NotPrivate | None = None
        try:
            self._run_dir_seen = runfolder.check_run_dir(self.run_dir, self._run_dir_seen)
            folder.mkdir(parents=True, exist_ok=True)
            self._run_dir_seen = self._run_dir_seen or runfolder.check_run_dir(self.run_dir, None)
        except NotPrivate as exc:
            failed = refused = exc
        except OSError as exc:
            failed = exc
        self._emit(CheckpointBegin(step=step, waited_for_previous_s=round(waited, 6)))
        if self.host is None:
            staging.forget(self.run_dir)  # the staging buffers are about to change
        else:
            self.host.keep = self.newest_committed  # its slot is kept; the other is restaged
        state = self._state()
        nbytes = staging.nbytes(state)
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
        writer.fs = WatchedFileSystem(io_errors) if refused is None else _Refused(io_errors, refused)
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
                save.held = staging.Held(step, None, extra_state)
            elif self.stager is not None:
                save.held = staging.Held(step, self.stager.last_staged, extra_state)
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
            except (Exception, CheckpointException) as exc:  # noqa: BLE001 - told, and dealt with, in wait()
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
            self.stager = self.host if self.host is not None else staging.ReusedBufferStager()
        return self.stager

    # -- the background part -------------------------------------------------------------------
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
        except BaseException as exc:  # noqa: BLE001 - reported by wait(); never kills the trainer thread
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
        except Exception as exc:  # noqa: BLE001 - the copy is only a faster restore: storage still has it
            say(f"host copy of step {save.step} not kept: {exc!r}")

    def _commit_once(self, save: _Save) -> None:
        """Rank 0 commits ``save`` unless it failed somewhere; every rank then marks it done."""
        try:
            if self.rank == 0 and save.error is None and not save.cancelled and not self.aborted:
                self._commit(save)
        except BaseException as exc:  # noqa: BLE001 - reported by wait(); never kills the trainer thread
            save.error = exc
        finally:
            save.committed.set()
            save.done.set()

    def _write_manifest(self, save: _Save) -> None:
        # The run folder is checked again after torch's writes: one swapped meanwhile gets no
        # manifest and no commit (``NotPrivate``: the save is dropped, nothing removed there).
        runfolder.check_run_dir(self.run_dir, self._run_dir_seen)
        layout.write_manifest(save.folder, self.rank, self.write_threads)
        if save.held is not None and save.held.state is not None and self.host is None:
            staging.hold(self.run_dir, save.held)

    def _commit(self, save: _Save) -> None:
        deadline = time.monotonic() + 600.0
        pause = 0.005  # (the other ranks' writes end about when this one's does: look again soon,
        # then less often; a soft fault's settle waits on this commit)
        while missing := layout.missing_manifests(save.folder, self.world):
            if self.aborted or save.cancelled:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    errno.ETIMEDOUT, f"{', '.join(missing)} not written within 600 s", str(save.folder)
                )
            time.sleep(pause)
            pause = min(0.05, pause * 1.5)
        runfolder.check_run_dir(self.run_dir, self._run_dir_seen)
        files = layout.write_committed(save.folder, step=save.step, world=self.world, token=save.token)
        final = layout.step_dir(self.run_dir, save.step)
        with _PLACING:
            # The same step may be on storage already: committed by an earlier attempt (kept when
            # it verifies), or a damaged folder (rejected, and this save takes its place).
            existed = final.exists()
            problem = layout.verify(final, save.step) if existed else None
            kept = existed and problem is None
            if kept:
                shutil.rmtree(save.folder, ignore_errors=True)
                staging.forget(self.run_dir)  # memory now differs from what is committed
            else:
                if problem is not None:
                    self._reject(final, save.step, problem)
                os.rename(save.folder, final)
                layout.fsync_dir(self.run_dir)
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
        save.committed.set()  # (a soft fault's settle need not wait for the retention)
        with contextlib.suppress(OSError):  # retention is tried again after the next commit
            layout.retain(self.run_dir, save.step, self.policy.keep)

    # -- the save in flight --------------------------------------------------------------------
    def wait(self) -> None:
        """Block until the save in flight is written and (rank 0) committed, or has failed.

        Every rank calls it (before each save, and in ``close``): the ranks first tell each
        other whether their part was written, so rank 0 never waits for a part that will not
        come, then learn from rank 0 whether it committed. A failed save is dropped (see the
        package's docstring); an error other than a storage error is raised here, on its rank."""
        save, self.inflight = self.inflight, None
        if save is None:
            return
        with self._paused():
            save.written.wait()
            failures = {r: f for r, f in enumerate(self.ranks.all_gather(self._failure(save))) if f}
            save.cancelled = bool(failures)
            if save.inline:
                self._commit_once(save)
            save.done.wait()
            if not failures:  # rank 0's commit: every rank knows it is done (or failed)
                committed = self.ranks.from_rank0(self._failure(save))
                failures = {0: committed} if committed else {}
        if not failures:
            self.failed_in_a_row = 0
            self.newest_committed = save.step
            return
        self._dropped(save, failures)
        mine = failures.get(self.rank)
        if mine is not None and mine[2] == "other" and save.error is not None:
            raise save.error

    def _failure(self, save: _Save) -> Failure | None:
        """This rank's part of ``save`` in one line; None when it was written (and committed)."""
        return failure(save.error, save.io_errors, self.rank)

    def _dropped(self, save: _Save, failures: dict[int, Failure]) -> None:
        """Every rank: forget the failed save; rank 0 also removes its partial folder, which may
        hold most of a checkpoint's bytes on a full volume, and reports it once."""
        self.failed_in_a_row += 1
        staging.forget(self.run_dir, save.step)
        if self.host is not None:
            self.host.forget(save.step)
        if self.rank != 0:
            return
        if not isinstance(save.error, NotPrivate):  # (never in a folder that is not the run's)
            shutil.rmtree(save.folder, ignore_errors=True)  # nobody writes to it any more
        event, line = dropped(
            save.step, str(save.folder), failures, self.failed_in_a_row, self.newest_committed
        )
        self._emit(event)
        say(line)

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
            finished = save.committed.wait(max(0.0, limit)) and save.error is None
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

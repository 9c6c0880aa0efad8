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

The package, one concern per module (each module's docstring says what it owns):

- ``layout``: on-disk names, manifests, COMMITTED, verification, moving aside, retention
  (files only: no torch, no ranks);
- ``staging``: host buffers, RNG states, the staged copy kept for an in-process restart;
- ``agreement``: the checkpoint's gloo group and what the ranks decide together;
- ``failures``: a failed save's storage error and its one report;
- ``core``: the state saving and restoring share; ``save``: the save protocol;
  ``restore``: the four restore sources (memory, host copy, peer, storage);
- here: the ``Checkpointer`` facade that joins them.
"""

from __future__ import annotations

from nvtrain.worker.checkpoint.layout import CorruptCheckpoint, committed_steps
from nvtrain.worker.checkpoint.restore import Restoring
from nvtrain.worker.checkpoint.save import Saving

__all__ = ["Checkpointer", "CorruptCheckpoint", "committed_steps"]


class Checkpointer(Saving, Restoring):
    """Saves and restores model + optimizer (+ extras) of one training attempt.

    Create one per attempt (after ``init_process_group``); call ``restore()`` once, then
    ``maybe_save(step)`` every step, and ``close()`` at the end. ``abort()`` drops a save in
    flight without committing it (in-process restart).
    """

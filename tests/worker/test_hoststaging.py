"""The page-locked buffers a restore into GPU memory reads through (``nvtrain.worker.hoststaging``):
made once per process, ahead of the restore when a copy is there to restore, lent to one restore
at a time; and the background threads that make them (or page-lock the host copy) work on this
rank's GPU, not GPU 0. Most of it needs a GPU (``-m gpu``); the CPU cases check the sizes and that
a CPU-only restore keeps nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from nvtrain.private import make_private_dir  # noqa: E402
from nvtrain.worker import hoststaging  # noqa: E402
from nvtrain.worker.hostcopy import ENV, HostCopy, Layout  # noqa: E402
from nvtrain.worker.hostread import CHUNK, threads  # noqa: E402
from nvtrain.worker.restore_ahead import sealed_bytes, warm_restore  # noqa: E402

MiB = 1 << 20
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize(
    ("nbytes", "readers", "count"),
    [
        (4 << 30, 6, 13),  # a large copy: 2 x readers ahead + the one hashed
        (200 * 10**6, 6, 6),  # fewer chunks than that: one buffer per chunk
        (1, 6, 2),  # never fewer than two (one read ahead)
        (0, 1, 2),
        (64 * MiB + 1, 1, 3),
    ],
)
def test_a_restore_uses_one_buffer_per_chunk_in_flight(nbytes: int, readers: int, count: int) -> None:
    assert hoststaging.buffers_for(nbytes, 32 * MiB, readers) == count


def test_a_cpu_restore_gets_buffers_of_its_own_and_keeps_none() -> None:
    before = hoststaging.kept_bytes()
    with hoststaging.borrow(3, 1000, pinned=False) as buffers:
        assert [(b.numel(), b.is_pinned()) for b in buffers] == [(1000, False)] * 3
    assert hoststaging.kept_bytes() == before


def _seal_header(folder: Path, rank: int, nbytes: int) -> None:
    """A slot header as ``HostCopy.seal`` leaves it; ``warm_restore`` reads only its size."""
    path = folder / f"rank{rank}.slot1.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"format": 3, "rank": rank, "bytes": nbytes}, handle)


def test_a_copy_is_found_by_its_rank_and_only_in_a_private_header(tmp_path: Path) -> None:
    folder = tmp_path / "shm"
    make_private_dir(folder)
    assert sealed_bytes(folder, 0) is None
    _seal_header(folder, rank=1, nbytes=64 * MiB)  # another rank's
    assert sealed_bytes(folder, 0) is None
    assert sealed_bytes(folder, 1) == 64 * MiB
    _seal_header(folder, rank=2, nbytes=64 * MiB)
    (folder / "rank2.slot1.json").chmod(0o644)  # others may write it: not used
    assert sealed_bytes(folder, 2) is None
    for rank, size in ((3, "64"), (4, True), (5, -1)):
        _seal_header(folder, rank=rank, nbytes=size)  # type: ignore[arg-type]
        assert sealed_bytes(folder, rank) is None
    (folder / "rank6.slot1.json").write_text("{not json")
    (folder / "rank6.slot1.json").chmod(0o600)
    assert sealed_bytes(folder, 6) is None


def test_nothing_is_made_without_the_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert warm_restore(0) is None


@pytest.mark.gpu
@cuda
def test_a_replacement_workers_buffers_are_made_ahead_and_lent_to_its_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "shm"
    make_private_dir(folder)
    monkeypatch.setenv(ENV, str(folder))
    nbytes = 100 * MiB  # 4 chunks of 32 MiB
    _seal_header(folder, rank=0, nbytes=nbytes)
    done = warm_restore(0)
    assert done is not None and done.wait(60)
    kept = hoststaging.kept_bytes()
    assert kept >= 4 * 32 * MiB
    with hoststaging.borrow(4, 32 * MiB, pinned=True) as buffers:
        assert all(b.is_pinned() and b.numel() == 32 * MiB for b in buffers)
        assert hoststaging.kept_bytes() == kept - 4 * 32 * MiB  # lent, not copied
        first = {b.data_ptr() for b in buffers}
    with hoststaging.borrow(4, 32 * MiB, pinned=True) as buffers:
        assert {b.data_ptr() for b in buffers} == first  # the same memory again
    assert hoststaging.kept_bytes() == kept
    assert warm_restore(0) is not None and hoststaging.kept_bytes() == kept  # made once


def _host_copy(tmp_path: Path) -> HostCopy:
    folder = tmp_path / "shm"
    make_private_dir(folder)
    return HostCopy(folder, run_id="staging", rank=0, world=1, key=bytes(32))


@pytest.mark.gpu
@cuda
def test_a_workers_buffers_are_made_once_its_slots_are_mapped(tmp_path: Path) -> None:
    """For its first in-process restart: its restore then makes no buffer of its own."""
    copy = _host_copy(tmp_path)
    state = {"w": torch.zeros(24 * MiB, device="cuda"), "b": torch.zeros(3, device="cuda")}  # 96 MiB
    copy.prepare(state)
    assert copy.staging_ready is not None and copy.staging_ready.wait(60)
    nbytes = Layout.of(state).nbytes
    count = hoststaging.buffers_for(nbytes, CHUNK, threads()[0])
    made = hoststaging.made()
    with hoststaging.borrow(count, min(CHUNK, nbytes), pinned=True) as buffers:
        assert len(buffers) == count >= 3
    assert hoststaging.made() == made
    copy.release()


@pytest.mark.gpu
@cuda
def test_a_cpu_state_makes_no_buffers_on_a_gpu_host(tmp_path: Path) -> None:
    """Its slots are page-locked (there is a GPU), but its restore uses no page-locked buffers."""
    copy = _host_copy(tmp_path)
    copy.prepare({"w": torch.zeros(1000)})
    assert copy.staging_ready is None
    copy.release()


_CHILD = textwrap.dedent(
    """
    import json, sys, threading, torch
    from pathlib import Path
    from nvtrain.worker.hostcopy import _Slot, in_background
    from nvtrain.worker.hoststaging import warm
    torch.cuda.set_device(1)
    torch.zeros(1, device="cuda")
    seen = {}
    slot = _Slot(Path(sys.argv[1]), "rank0.slot0", 0)
    slot.open_bytes(8 << 20)
    def work():
        seen["device"] = torch.cuda.current_device()
        slot.pin()
    in_background(work, name="test").wait(60)
    warm(64 << 20, 32 << 20, 1, 1).wait(60)
    print(json.dumps({
        "device": seen["device"],
        "pinned": slot.pinned and slot.flat.is_pinned(),
        "gpu0_context": torch._C._cuda_hasPrimaryContext(0),
    }))
    """
)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_background_threads_work_on_this_ranks_gpu_and_make_no_context_on_gpu_0(tmp_path: Path) -> None:
    folder = tmp_path / "shm"
    make_private_dir(folder)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder)], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "device": 1,
        "pinned": True,
        "gpu0_context": False,
    }

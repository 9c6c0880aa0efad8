"""Forged state is never run: a host copy, a checkpoint's ``extra-rank0.pt``, its ``.metadata`` or
an item in its shards whose pickle would create a marker file (as a ``__reduce__`` calling
``os.system`` would run any command as the worker's user) is refused with the reason, and the
state comes from storage (or the checkpoint before), bitwise. The host-copy folder is this user's
alone: another user can neither read nor write what a worker keeps there, and a folder that is
not private is not used. An extra that is not plain data is an error at save time.

One process, world of one, real files and real torch (helpers shared with
``test_checkpointer.py`` and ``test_hostcopy.py``); the user ``nobody`` (uid 65534) through
``setpriv`` where the test runs as root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xxhash
from test_checkpointer import _bits, _checkpointer, _events, _model, _named, _policy, _train
from test_hostcopy import _header, _new_process, _restore, _saved

from nvtrain.private import make_private_dir
from support.forgery import Marker, forge_copy, pickled
from support.worker_helpers import run_key_env

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
    )
]

NOBODY = 65534


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing in this process's memory, and the run's key in ``$NVTRAIN_RUN_KEY_FILE``."""
    import nvtrain.worker.checkpoint.staging as checkpoint
    import nvtrain.worker.hostcopy as hostcopy

    monkeypatch.setattr(checkpoint, "_IN_MEMORY", {})
    monkeypatch.setattr(hostcopy, "_COPIES", {})
    monkeypatch.delenv("NVTRAIN_HOST_COPY_DIR", raising=False)
    for name, value in run_key_env(tmp_path / "keys").items():
        monkeypatch.setenv(name, value)


def _forge(shm: Path, marker: Path, hashes: str) -> None:
    """Replace step 10's copy's extra file by a pickle that creates ``marker``, and make its
    header match it as an attacker who can write the folder can (``forge_copy``: ``old``,
    ``unkeyed`` or ``wrong-key`` hashes)."""
    forge_copy(_header(shm, 10), pickled({"skeleton": Marker(marker), "extra": Marker(marker)}), hashes)


@pytest.mark.parametrize("hashes", ["old", "unkeyed", "wrong-key"])
def test_a_forged_host_copy_is_refused_and_never_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hashes: str
) -> None:
    run_dir, shm, saved, position = _saved(tmp_path)
    marker = tmp_path / "ran"
    _forge(shm, marker, hashes)
    _new_process(monkeypatch)
    try:
        restored, bits, restored_position = _restore(tmp_path, run_dir, shm)
    finally:
        assert not marker.exists(), "the forged copy's pickle ran"
    assert [(e["step"], e["origin"]) for e in restored] == [(10, "storage")], restored
    assert "MAC does not verify (not this run's copy)" in restored[0]["memory_problem"], restored
    assert bits == saved and restored_position == position


def test_a_host_copy_sealed_with_the_run_key_still_runs_no_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even a copy whose MAC verifies (sealed with the run's key: a bug, or a stolen key) is read
    as plain data: its extra is refused, the restore reads storage and says why."""
    from nvtrain.private import run_key
    from nvtrain.worker.hostcopy import _sealed_header

    run_dir, shm, saved, position = _saved(tmp_path)
    marker = tmp_path / "ran"
    header_path = _header(shm, 10)
    slot = header_path.name.split(".")[1]
    extra = pickled({"skeleton": Marker(marker), "extra": {}})
    (shm / f"rank0.{slot}.extra").write_bytes(extra)
    fields = json.loads(header_path.read_text())
    data = memoryview((shm / f"rank0.{slot}.bin").read_bytes())[: fields["bytes"]]
    key = run_key()
    assert key is not None
    header_path.write_bytes(_sealed_header(fields, data, extra, key))
    _new_process(monkeypatch)
    try:
        restored, bits, restored_position = _restore(tmp_path, run_dir, shm)
    finally:
        assert not marker.exists(), "the copy's pickle ran"
    assert [(e["step"], e["origin"]) for e in restored] == [(10, "storage")], restored
    problem = restored[0]["memory_problem"]
    assert "loading it failed" in problem and "not allowed: posix.system" in problem, problem
    assert bits == saved and restored_position == position


# -- checkpoints on storage ------------------------------------------------------------------------


def _two_checkpoints(run_dir: Path) -> dict[str, Any]:
    """Steps 10 and 20 saved (sync, no host copy); the bits of step 10."""
    model, optimizer = _model(0)
    ckpt = _checkpointer(run_dir, model, optimizer, _policy(False))
    ckpt.restore()
    _train(model, optimizer, 2, seed=1)
    ckpt.save(10)
    at_10 = _bits(model, optimizer)
    _train(model, optimizer, 2, seed=2)
    ckpt.save(20)
    ckpt.close()
    return at_10


def _recommit(folder: Path) -> None:
    """Make COMMITTED (and the manifests) list the files as they are now: what an attacker who
    can write the volume does, so that the files pass the manifest check."""
    committed = json.loads((folder / "COMMITTED").read_text())
    for name in committed["files"]:
        data = (folder / name).read_bytes()
        committed["files"][name] = {"size": len(data), "xxh3": xxhash.xxh3_64_hexdigest(data)}
    (folder / "COMMITTED").write_text(json.dumps(committed, sort_keys=True))


def _forge_extra(folder: Path, marker: Path) -> None:
    (folder / "extra-rank0.pt").write_bytes(pickled({"rng": Marker(marker), "extra": {}}))


def _forge_metadata(folder: Path, marker: Path) -> None:
    import pickle

    (folder / ".metadata").write_bytes(pickle.dumps(Marker(marker)))


def _forge_shard_item(folder: Path, marker: Path) -> None:
    """Write the step's shards again with one non-tensor item (the optimizer's learning rate,
    which DCP keeps as a pickle in the shards) replaced by the marker's pickle."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer = _model(3)
    _train(model, optimizer, 1, seed=3)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    optim_sd["param_groups"][0]["lr"] = Marker(marker)
    forged = folder.with_name("forged")
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(forged), no_dist=True)
    for path in folder.glob("*.distcp"):
        path.unlink()
    for path in forged.iterdir():
        shutil.copyfile(path, folder / path.name)


@pytest.mark.parametrize(
    ("forge", "refused"),
    [
        (_forge_extra, "extra-rank0.pt names a class that is not allowed: posix.system"),
        (_forge_metadata, "the .metadata names a class that is not allowed: posix.system"),
        (_forge_shard_item, "names a class that is not allowed: posix.system"),
    ],
    ids=["extra-rank0.pt", "metadata", "shard-item"],
)
def test_a_forged_checkpoint_is_rejected_and_never_run(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], forge: Any, refused: str
) -> None:
    run_dir = tmp_path / "run"
    at_10 = _two_checkpoints(run_dir)
    marker = tmp_path / "ran"
    forge(run_dir / "step-000020", marker)
    _recommit(run_dir / "step-000020")
    log = tmp_path / "events.jsonl"
    model, optimizer = _model(9)
    try:
        step = _checkpointer(run_dir, model, optimizer, _policy(False), _events(log)).restore()
    finally:
        assert not marker.exists(), "the forged checkpoint's pickle ran"
    assert step == 10 and _bits(model, optimizer) == at_10
    (rejected,) = _named(log, "checkpoint_rejected")
    assert rejected["step"] == 20 and refused in rejected["problem"], rejected
    assert not (run_dir / "step-000020").exists() and rejected["moved_to"]
    said = capfd.readouterr().err
    assert f"checkpoint rejected: step 20: {rejected['problem']}" in said, said
    assert "Traceback" not in said


def test_a_damaged_file_found_by_another_check_says_which(tmp_path: Path) -> None:
    """The rejection names the file and what was wrong with it."""
    run_dir = tmp_path / "run"
    _two_checkpoints(run_dir)
    extra = run_dir / "step-000020" / "extra-rank0.pt"
    extra.write_bytes(extra.read_bytes()[:-1] + b"x")
    log = tmp_path / "events.jsonl"
    model, optimizer = _model(9)
    assert _checkpointer(run_dir, model, optimizer, _policy(False), _events(log)).restore() == 10
    (rejected,) = _named(log, "checkpoint_rejected")
    assert rejected["problem"] == "extra-rank0.pt does not match its manifest's digest", rejected


# -- the folder ----------------------------------------------------------------------------------


@pytest.fixture
def shared_parent() -> Iterator[Path]:
    """A folder in /dev/shm that every user may enter (as ``nvtrain run``'s parent of the host
    copies is): only the host-copy folder's own mode and owner keep others out."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another user")
    parent = Path(tempfile.mkdtemp(prefix="nvtrain-test-", dir="/dev/shm"))
    parent.chmod(0o755)
    try:
        yield parent
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _save_with_copy(tmp_path: Path, shm: Path) -> Any:
    model, optimizer = _model(0)
    ckpt = _checkpointer(tmp_path / "run", model, optimizer, _policy(True), host_copy_dir=str(shm))
    ckpt.restore()
    _train(model, optimizer, 1, seed=1)
    ckpt.save(10)
    ckpt.close()
    return ckpt


def test_another_user_can_neither_read_nor_write_the_copies(tmp_path: Path, shared_parent: Path) -> None:
    """Every file the worker makes in the folder is 0600: with the folder opened for others to
    pass through (0711), another user still can neither read nor change one."""
    shm = shared_parent / "copies"
    make_private_dir(shm)
    assert _save_with_copy(tmp_path, shm).host is not None
    names = sorted(p.name for p in shm.iterdir())
    assert {"rank0.slot0.bin", "rank0.slot0.extra", "rank0.slot0.json"} <= set(names), names
    assert _as_nobody("touch", str(shm / "planted")).returncode != 0  # the folder: 0700
    shm.chmod(0o711)
    for name in names:
        mode = (shm / name).stat().st_mode & 0o777
        assert mode == 0o600, (name, oct(mode))
        read = _as_nobody("cat", str(shm / name))
        written = _as_nobody("sh", "-c", f"echo forged > {shm / name}")
        assert read.returncode != 0 and "Permission denied" in read.stderr, (name, read)
        assert written.returncode != 0 and "Permission denied" in written.stderr, (name, written)


@pytest.mark.parametrize("how", ["mode-0777", "nobody's"])
def test_a_folder_that_is_not_private_keeps_no_copy(
    tmp_path: Path, shared_parent: Path, capfd: pytest.CaptureFixture[str], how: str
) -> None:
    shm = shared_parent / "copies"
    make_private_dir(shm)
    if how == "mode-0777":
        shm.chmod(0o777)
        why = "has mode 0777"
    else:
        os.chown(shm, NOBODY, NOBODY)
        why = "belongs to uid 65534"
    ckpt = _save_with_copy(tmp_path, shm)
    assert ckpt.host is None and list(shm.iterdir()) == []
    said = capfd.readouterr().err
    assert f"no host copy in {shm}: the folder {why}" in said, said


def test_without_a_run_key_no_copy_is_kept_in_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A worker not started by ``nvtrain run`` has no key: a copy in files could not be told from
    a forged one, so it keeps the copy in its own memory (in-process restarts still use it)."""
    monkeypatch.delenv("NVTRAIN_RUN_KEY_FILE")
    shm = tmp_path / "shm"
    make_private_dir(shm)
    model, optimizer = _model(0)
    ckpt = _checkpointer(tmp_path / "run", model, optimizer, _policy(True), host_copy_dir=str(shm))
    ckpt.restore()
    _train(model, optimizer, 1, seed=1)
    ckpt.save(10)
    ckpt.close()
    saved = _bits(model, optimizer)
    assert ckpt.host is None and list(shm.iterdir()) == []
    assert "NVTRAIN_RUN_KEY_FILE is not set" in capfd.readouterr().err
    log = tmp_path / "events.jsonl"
    model, optimizer = _model(7)
    _checkpointer(
        tmp_path / "run", model, optimizer, _policy(True), _events(log), host_copy_dir=str(shm)
    ).restore()
    assert [e["origin"] for e in _named(log, "checkpoint_restored")] == ["memory"]
    assert _bits(model, optimizer) == saved


# -- what extras may hold ---------------------------------------------------------------------------


class _Loader:
    """A data loader whose state holds an object that is not plain data."""

    def state_dict(self) -> dict[str, Any]:
        return {"position": 3, "shards": [{"name": "a", "sampler": random_state()}]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def random_state() -> Any:
    import random

    return random.Random(0)


def test_an_extra_that_is_not_plain_data_is_an_error_at_save(tmp_path: Path) -> None:
    from nvtrain.errors import NvtrainError

    run_dir = tmp_path / "run"
    model, optimizer = _model(0)
    ckpt = _checkpointer(run_dir, model, optimizer, _policy(True), extra={"data": _Loader()})
    ckpt.restore()
    with pytest.raises(NvtrainError) as raised:
        ckpt.save(10)
    text = str(raised.value)
    assert text.startswith("extra 'data' at ['shards'][0]['sampler'] is a random.Random,"), text
    assert "convert it" in text.lower() and "state_dict()" in text, text
    assert not run_dir.exists() or list(run_dir.iterdir()) == []  # nothing written


def test_a_checkpoint_written_before_plain_rng_states_still_restores(tmp_path: Path) -> None:
    """Earlier versions kept numpy's ``get_state()`` tuple (with its array) in extra-rank0.pt:
    read back as numpy's arrays only (no other class), it restores numpy's generator."""
    import numpy
    import torch

    run_dir = tmp_path / "run"
    _two_checkpoints(run_dir)
    folder = run_dir / "step-000020"
    extra = torch.load(folder / "extra-rank0.pt", weights_only=True)
    numpy.random.seed(1234)
    extra["rng"]["numpy"] = numpy.random.get_state()
    wanted = numpy.random.random(3)
    numpy.random.seed(0)
    (folder / "extra-rank0.pt").write_bytes(pickled(extra))
    _recommit(folder)
    model, optimizer = _model(9)
    assert _checkpointer(run_dir, model, optimizer, _policy(False)).restore() == 20
    assert numpy.array_equal(numpy.random.random(3), wanted)


def test_numpy_rng_state_is_kept_as_plain_data_and_restored(tmp_path: Path) -> None:
    import numpy
    import torch

    run_dir = tmp_path / "run"
    model, optimizer = _model(0)
    ckpt = _checkpointer(run_dir, model, optimizer, _policy(False))
    ckpt.restore()
    numpy.random.seed(99)
    numpy.random.random(5)
    ckpt.save(10)
    ckpt.close()
    wanted = numpy.random.random(3)
    saved = torch.load(run_dir / "step-000010" / "extra-rank0.pt", weights_only=True)["rng"]["numpy"]
    assert isinstance(saved, dict) and len(saved["keys"]) == 624, saved
    numpy.random.seed(0)
    model, optimizer = _model(9)
    assert _checkpointer(run_dir, model, optimizer, _policy(False)).restore() == 10
    assert numpy.array_equal(numpy.random.random(3), wanted)

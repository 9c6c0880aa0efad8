"""The host copy that outlives the worker (``nvtrain.worker.hostcopy``): a replacement process
restores the newest committed checkpoint from the slot files bitwise, and never from a copy that
is stale, partial, foreign or damaged (each header field, the data and the extra state are
corrupted in turn; the restore then reads storage and says why)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_checkpointer import (
    Position,
    _bits,
    _checkpointer,
    _committed,
    _events,
    _flip_byte,
    _model,
    _named,
    _policy,
    _train,
)

from nvtrain.private import make_private_dir
from support.worker_helpers import run_key_env

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
    )
]


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A fresh process of a run: nothing in memory, and the run's key (as ``nvtrain run``
    gives its workers) in ``$NVTRAIN_RUN_KEY_FILE``."""
    import nvtrain.worker.checkpoint.staging as checkpoint
    import nvtrain.worker.hostcopy as hostcopy

    monkeypatch.setattr(checkpoint, "_IN_MEMORY", {})
    monkeypatch.setattr(hostcopy, "_COPIES", {})
    monkeypatch.delenv("NVTRAIN_HOST_COPY_DIR", raising=False)
    for name, value in run_key_env(tmp_path / "keys").items():
        monkeypatch.setenv(name, value)


def _new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a replacement worker has: the files in the folder, nothing in the process."""
    import nvtrain.worker.checkpoint.staging as checkpoint
    import nvtrain.worker.hostcopy as hostcopy

    monkeypatch.setattr(checkpoint, "_IN_MEMORY", {})
    monkeypatch.setattr(hostcopy, "_COPIES", {})


def _saved(tmp_path: Path, steps: tuple[int, ...] = (10,)) -> tuple[Path, Path, dict[str, Any], int]:
    """Save ``steps`` with a host copy in ``tmp_path/shm``; the bits and position of the last."""
    run_dir, shm = tmp_path / "run", tmp_path / "shm"
    make_private_dir(shm)
    model, optimizer = _model(0)
    position = Position(0)
    ckpt = _checkpointer(
        run_dir, model, optimizer, _policy(True), extra={"position": position}, host_copy_dir=str(shm)
    )
    assert ckpt.restore() == 0
    saved: dict[str, Any] = {}
    for step in steps:
        _train(model, optimizer, 2, seed=step)
        position.value = step * 100
        saved = _bits(model, optimizer)
        ckpt.save(step)
        ckpt.wait()
    ckpt.close()
    _train(model, optimizer, 2, seed=1)  # the live state moves on
    return run_dir, shm, saved, steps[-1] * 100


def _restore(tmp_path: Path, run_dir: Path, shm: Path, **kw: Any) -> tuple[Any, dict[str, Any], int]:
    """A fresh model restored with the host copy folder ``shm``: (the checkpointer, its bits,
    the position restored)."""
    log = tmp_path / f"events-{len(list(tmp_path.glob('events-*')))}.jsonl"
    model, optimizer = _model(7)
    position = Position(0)
    ckpt = _checkpointer(
        run_dir, model, optimizer, _policy(True), _events(log), extra={"position": position},
        host_copy_dir=str(shm), **kw,
    )  # fmt: skip
    ckpt.restore()
    ckpt.close()
    restored = _named(log, "checkpoint_restored")
    return restored, _bits(model, optimizer), position.value


def _header(shm: Path, step: int) -> Path:
    for path in sorted(shm.glob("rank0.slot*.json")):
        if json.loads(path.read_text())["step"] == step:
            return path
    raise AssertionError(f"no header for step {step}: {sorted(p.name for p in shm.iterdir())}")


def test_a_replacement_process_restores_from_the_host_copy_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, shm, saved, position = _saved(tmp_path)
    header = json.loads(_header(shm, 10).read_text())
    committed = json.loads((run_dir / "step-000010" / "COMMITTED").read_text())
    assert header["token"] == committed["token"] and header["run_id"] == "run"
    assert (header["rank"], header["world"], header["step"]) == (0, 1, 10)
    _new_process(monkeypatch)
    restored, bits, restored_position = _restore(tmp_path, run_dir, shm)
    assert [(e["step"], e["origin"]) for e in restored] == [(10, "memory")]
    assert bits == saved and restored_position == position


def test_the_newest_committed_copy_survives_the_next_save_in_its_other_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps 10 and 20 sit in the two slots; with step 20's commit gone (the save that a kill
    left uncommitted), the restore takes step 10 from memory."""
    run_dir, shm, _saved20, _ = _saved(tmp_path, (10,))
    saved10 = None
    # Save 10 again in a fresh series so that its bits are known, then 20.
    run_dir, shm = tmp_path / "run2", tmp_path / "shm2"
    make_private_dir(shm)
    model, optimizer = _model(0)
    ckpt = _checkpointer(run_dir, model, optimizer, _policy(True), host_copy_dir=str(shm))
    ckpt.restore()
    for step in (10, 20):
        _train(model, optimizer, 1, seed=step)
        if step == 10:
            saved10 = _bits(model, optimizer)
        ckpt.save(step)
        ckpt.wait()
    ckpt.close()
    assert sorted(json.loads(p.read_text())["step"] for p in shm.glob("rank0.slot*.json")) == [10, 20]
    import shutil

    shutil.rmtree(run_dir / "step-000020")
    _new_process(monkeypatch)
    restored, bits, _ = _restore(tmp_path, run_dir, shm)
    assert [(e["step"], e["origin"]) for e in restored] == [(10, "memory")]
    assert bits == saved10


def _edit_header(key: str, value: Any) -> Any:
    def edit(shm: Path) -> None:
        path = _header(shm, 10)
        header = json.loads(path.read_text())
        header[key] = value
        path.write_text(json.dumps(header))

    return edit


def _remove_header(shm: Path) -> None:
    _header(shm, 10).unlink()  # a worker killed while staging leaves no header


def _garble_header(shm: Path) -> None:
    _header(shm, 10).write_text("{not json")


def _flip_data(shm: Path) -> None:
    slot = _header(shm, 10).name.split(".")[1]
    _flip_byte(shm / f"rank0.{slot}.bin")


def _flip_data_end(shm: Path) -> None:
    """The last byte the header's hash covers: checked in the copy's last chunk."""
    header = _header(shm, 10)
    slot = header.name.split(".")[1]
    with (shm / f"rank0.{slot}.bin").open("r+b") as handle:
        handle.seek(json.loads(header.read_text())["bytes"] - 1)
        byte = handle.read(1)[0]
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte ^ 0x01]))


def _flip_extra(shm: Path) -> None:
    slot = _header(shm, 10).name.split(".")[1]
    _flip_byte(shm / f"rank0.{slot}.extra")


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (_edit_header("run_id", "another-run"), "run_id 'another-run'"),  # foreign: another run
        (_edit_header("rank", 1), "rank 1"),  # foreign: another rank's copy
        (_edit_header("world", 2), "world 2"),  # another world size
        (_edit_header("step", 9), "step 9"),  # stale
        (_edit_header("token", "00000000"), "token '00000000'"),  # a dropped save of the same step
        (_edit_header("layout", "x" * 32), "layout 'xxxx"),  # another model
        (_edit_header("format", 99), "format 99"),
        (_remove_header, "no header"),  # partial: killed while staging
        (_garble_header, "no header"),
        (_flip_data, "the data does not match its hash"),
        (_flip_data_end, "the data does not match its hash"),
        (_flip_extra, "the extra state does not match its hash"),
    ],
    ids=[
        "run-id", "rank", "world", "step", "token", "layout", "format",
        "no-header", "garbled-header", "data", "data-end", "extra",
    ],
)  # fmt: skip
def test_a_bad_copy_is_never_loaded_and_storage_is_read_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: Any, why: str
) -> None:
    run_dir, shm, saved, position = _saved(tmp_path)
    damage(shm)
    _new_process(monkeypatch)
    restored, bits, restored_position = _restore(tmp_path, run_dir, shm)
    assert [(e["step"], e["origin"]) for e in restored] == [(10, "storage")]
    assert why in restored[0]["memory_problem"], restored[0]
    assert bits == saved and restored_position == position


def test_a_copy_of_another_model_is_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The live model's layout differs (another width): storage is read (and fails the same
    way it would without a copy), never a reinterpreted buffer."""
    import torch

    run_dir, shm, _, _ = _saved(tmp_path)
    _new_process(monkeypatch)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    log = tmp_path / "other.jsonl"
    ckpt = _checkpointer(run_dir, model, optimizer, _policy(True), _events(log), host_copy_dir=str(shm))
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException, match="Size mismatch"):
        ckpt.restore()
    assert _named(log, "checkpoint_restored") == []


def test_in_process_restart_uses_the_copy_too(tmp_path: Path) -> None:
    run_dir, shm, saved, position = _saved(tmp_path)
    restored, bits, restored_position = _restore(tmp_path, run_dir, shm)  # same process
    assert [(e["step"], e["origin"]) for e in restored] == [(10, "memory")]
    assert bits == saved and restored_position == position


def test_without_the_folder_the_copy_stays_in_the_process(tmp_path: Path) -> None:
    """A worker started without ``nvtrain run`` (no ``NVTRAIN_HOST_COPY_DIR``) writes no files."""
    run_dir = tmp_path / "run"
    model, optimizer = _model(0)
    ckpt = _checkpointer(run_dir, model, optimizer, _policy(True))
    ckpt.restore()
    ckpt.save(10)
    ckpt.close()
    assert ckpt.host is None


_KILLED_SAVER = textwrap.dedent(
    """
    import sys, torch, random
    sys.path[:0] = [{tests!r}, {tests!r} + "/.."]  # test_checkpointer, and support/ it imports
    from test_checkpointer import _model, _train, _bits, _policy, Position
    from nvtrain.worker import Checkpointer
    import hashlib, pickle
    model, optimizer = _model(0)
    position = Position(0)
    ckpt = Checkpointer(model=model, optimizer=optimizer, run_dir=__import__("pathlib").Path({run!r}),
                        policy=_policy(True), extra={{"position": position}}, host_copy_dir={shm!r})
    ckpt.restore()
    _train(model, optimizer, 3, seed=3)
    position.value = 4321
    ckpt.save(10)
    ckpt.wait()
    _train(model, optimizer, 2, seed=4)
    ckpt.save(15)  # staged into the other slot, then killed while it is written (or after)
    print(hashlib.sha256(pickle.dumps(sorted(_bits(model, optimizer).items()))).hexdigest(), flush=True)
    print("saved", flush=True)
    sys.stdin.read()
    """
)


def test_a_sigkilled_worker_is_replaced_by_a_process_that_restores_from_memory(tmp_path: Path) -> None:
    """Real processes: one saves and is SIGKILLed; the next restores step 10 or 15 (whichever
    is committed) from the host copy, bitwise."""
    run, shm = tmp_path / "run", tmp_path / "shm"
    make_private_dir(shm)
    tests = str(Path(__file__).parent)
    script = _KILLED_SAVER.format(tests=tests, run=str(run), shm=str(shm))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("NVTRAIN_HOST_COPY_DIR", None)
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        digest15 = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == "saved"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    restorer = textwrap.dedent(
        """
        import sys, json, hashlib, pickle, pathlib
        sys.path[:0] = [{tests!r}, {tests!r} + "/.."]  # test_checkpointer, and support/ it imports
        from test_checkpointer import _model, _bits, _policy, Position
        from nvtrain.worker import Checkpointer
        from nvtrain.events import EventLog
        model, optimizer = _model(7)
        position = Position(0)
        log = EventLog(pathlib.Path({log!r}), run_id="run", source="test")
        ckpt = Checkpointer(model=model, optimizer=optimizer, run_dir=pathlib.Path({run!r}),
                            policy=_policy(True), events=log, extra={{"position": position}},
                            host_copy_dir={shm!r})
        step = ckpt.restore()
        bits = pickle.dumps(sorted(_bits(model, optimizer).items()))
        print(step, position.value, hashlib.sha256(bits).hexdigest())
        """
    ).format(tests=tests, run=str(run), shm=str(shm), log=str(tmp_path / "events.jsonl"))
    out = subprocess.run(
        [sys.executable, "-c", restorer], capture_output=True, text=True, env=env, check=True
    )
    step, value, digest = out.stdout.split()
    restored = _named(tmp_path / "events.jsonl", "checkpoint_restored")
    assert [e["origin"] for e in restored] == ["memory"], restored
    if step == "15":  # the save of step 15 was committed before the kill
        assert digest == digest15 and value == "4321"
    else:
        assert step == "10" and value == "4321"


def _tmpfs(folder: Path, size: str) -> Any:
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Any:
    """A 64 KiB memory-backed folder: too small for two slots of the test model's state."""
    yield from _tmpfs(tmp_path / "small-shm", "64k")


@pytest.fixture
def full_volume(tmp_path: Path) -> Any:
    """A 1 MiB checkpoint volume: a third of the test model's state fits."""
    yield from _tmpfs(tmp_path / "full-volume", "1m")


def test_a_folder_without_room_turns_the_copy_off_and_saves_go_on(
    tmp_path: Path, small_tmpfs: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    run_dir = tmp_path / "run"
    torch.manual_seed(0)
    model = torch.nn.Linear(128, 128)  # 64 KiB of weights, x2 with AdamW, x2 slots
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = _checkpointer(run_dir, model, optimizer, _policy(True), host_copy_dir=str(small_tmpfs))
    ckpt.restore()
    model(torch.randn(4, 128)).sum().backward()
    optimizer.step()
    saved = _bits(model, optimizer)
    ckpt.save(10)
    ckpt.save(20)
    ckpt.close()
    said = capfd.readouterr().err
    assert said.count("cannot keep the host copy") == 1, said
    assert "No space left on device" in said
    assert list(small_tmpfs.iterdir()) == []  # what it had mapped is removed
    assert _committed(run_dir) == [10, 20]
    _new_process(monkeypatch)
    fresh = torch.nn.Linear(128, 128)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    log = tmp_path / "events.jsonl"
    _checkpointer(
        run_dir, fresh, fresh_optimizer, _policy(True), _events(log), host_copy_dir=str(small_tmpfs)
    ).restore()
    assert [e["origin"] for e in _named(log, "checkpoint_restored")] == ["storage"]
    assert _bits(fresh, fresh_optimizer) == saved


def test_a_full_volume_under_several_writer_threads_fails_the_save_without_a_traceback(
    tmp_path: Path, full_volume: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """torch's extra writer threads (write_threads = 4) die of ENOSPC on their own: the save is
    dropped (never committed with some files missing), and no thread's traceback is printed."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512, bias=False)  # 1 MiB of weights, 3 MiB with AdamW's state
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 512)).sum().backward()
    optimizer.step()
    log = tmp_path / "events.jsonl"
    ckpt = _checkpointer(full_volume / "run", model, optimizer, _policy(True), _events(log), write_threads=4)
    ckpt.save(10)
    ckpt.close()
    failed = _named(log, "checkpoint_failed")
    assert [(e["step"], e["errno"]) for e in failed] == [(10, "ENOSPC")], failed
    assert _committed(full_volume / "run") == []
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    assert "checkpoint of step 10 not saved" in err


def test_a_copy_that_fails_to_load_falls_back_to_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked and agreed, then the load itself raises (here: made to): every rank reads storage,
    which overwrites whatever the failed load had copied."""
    import nvtrain.worker.hostcopy as hostcopy

    run_dir, shm, saved, position = _saved(tmp_path)
    _new_process(monkeypatch)

    def broken(self: Any, slot: Any, live: Any) -> Any:
        raise RuntimeError("the copy could not be applied")

    monkeypatch.setattr(hostcopy.HostCopy, "load", broken)
    restored, bits, restored_position = _restore(tmp_path, run_dir, shm)
    assert [(e["step"], e["origin"]) for e in restored] == [(10, "storage")]
    assert "loading it failed" in restored[0]["memory_problem"]
    assert bits == saved and restored_position == position


def test_a_copy_changed_after_it_was_found_is_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data is checked as it is read into the live tensors, not before: a file changed
    between ``find`` and ``load`` (by a process of this user's) is refused like a damaged one,
    and the state comes from storage, bitwise."""
    import nvtrain.worker.hostcopy as hostcopy

    run_dir, shm, saved, position = _saved(tmp_path)
    _new_process(monkeypatch)
    find = hostcopy.HostCopy.find

    def find_then_change(self: Any, **kw: Any) -> Any:
        slot, why = find(self, **kw)
        if slot is not None:
            _flip_data(shm)
        return slot, why

    monkeypatch.setattr(hostcopy.HostCopy, "find", find_then_change)
    restored, bits, restored_position = _restore(tmp_path, run_dir, shm)
    assert [(e["step"], e["origin"]) for e in restored] == [(10, "storage")]
    problem = restored[0]["memory_problem"]
    assert "loading it failed" in problem and "the data does not match its hash" in problem, problem
    assert bits == saved and restored_position == position

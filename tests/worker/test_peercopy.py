"""Host copies kept on another pod (``nvtrain.worker.peercopy``): 4 real gloo ranks on two
emulated pods (2 ranks each, a host-copy folder per pod). After the saves every rank's copy is
also in the other pod's folder; when pod 1 is lost (its folder gone), its ranks get their copies
back from pod 0 and the state restored is bitwise the saved one; a damaged or missing peer copy
is never loaded and every rank reads storage instead, saying why."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from nvtrain.events import read_events
from nvtrain.private import make_private_dir
from support.worker_helpers import BIN, WarmServer, child_env, free_port_pair, run_key_env, run_ranks

pytestmark = pytest.mark.slow

WORLD, PER_POD = 4, 2


def _ranks(base: Path, mode: str, warm: WarmServer) -> list[dict[str, Any]]:
    """Run ``peer_copies.py MODE`` as ranks 0-3 (pod ``rank // 2``'s folder: base/shm/pod<i>)."""
    port = free_port_pair()
    envs = [
        child_env(
            RANK=str(rank),
            LOCAL_RANK=str(rank % PER_POD),
            WORLD_SIZE=str(WORLD),
            LOCAL_WORLD_SIZE=str(PER_POD),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            NVTRAIN_HOST_COPY_DIR=str(base / "shm" / f"pod{rank // PER_POD}"),
            NVTRAIN_RUN_KEY_FILE=str(base / "keys" / f"pod{rank // PER_POD}" / "run.key"),
        )
        for rank in range(WORLD)
    ]
    argvs = [
        [
            sys.executable,
            str(BIN / "peer_copies.py"),
            mode,
            str(base / "run"),
            str(base / f"{mode}{rank}.json"),
        ]
        for rank in range(WORLD)
    ]
    run_ranks(argvs, envs, warm=warm)
    return [json.loads((base / f"{mode}{rank}.json").read_text()) for rank in range(WORLD)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, warm_server: WarmServer) -> tuple[Path, list[str]]:
    """Steps 10 and 20 saved by 4 ranks on 2 pods; (the folder, each rank's digest at step 20)."""
    base = tmp_path_factory.mktemp("peer")
    for name in ("shm", "keys"):
        make_private_dir(base / name)
    for pod in range(WORLD // PER_POD):  # each pod's launcher has its own key
        make_private_dir(base / "shm" / f"pod{pod}")
        run_key_env(base / "keys" / f"pod{pod}")
    results = _ranks(base, "save", warm_server)
    digests = [r["saved"] for r in results]
    assert len(set(digests)) == WORLD, digests  # each rank's state is its own
    return base, digests


def _copy(saved: tuple[Path, list[str]], tmp_path: Path) -> Path:
    base = tmp_path / "job"
    shutil.copytree(saved[0] / "run", base / "run")
    shutil.copytree(saved[0] / "shm", base / "shm")
    shutil.copytree(saved[0] / "keys", base / "keys")
    return base


def _lose_pod_1(base: Path) -> None:
    """Pod 1 is replaced: its memory (and every copy in it) is gone, and its new launcher has a
    new key."""
    shutil.rmtree(base / "shm" / "pod1")
    make_private_dir(base / "shm" / "pod1")
    shutil.rmtree(base / "keys" / "pod1")
    run_key_env(base / "keys" / "pod1")


def _restores(base: Path) -> list[Any]:
    return [e for e in read_events(base / "run" / "events.jsonl") if e.name == "checkpoint_restored"]


def test_every_copy_is_also_kept_by_a_rank_of_the_other_pod(saved: tuple[Path, list[str]]) -> None:
    base, _ = saved
    for pod, kept in ((0, (2, 3)), (1, (0, 1))):
        folder = base / "shm" / f"pod{pod}"
        for source in kept:
            header = json.loads((folder / f"peer-rank{source}.json").read_text())
            assert (header["rank"], header["world"], header["step"]) == (source, WORLD, 20), header
            assert header["run_id"] == "peer-copies"
            assert (folder / f"peer-rank{source}.bin").stat().st_size == header["bytes"]
    replicated = [e for e in read_events(base / "run" / "events.jsonl") if e.name == "checkpoint_replicated"]
    for rank in range(WORLD):
        mine = {e.step: e for e in replicated if e.rank == rank}
        assert sorted(mine) == [10, 20], replicated
        assert mine[20].error is None and mine[20].to_rank == (rank + PER_POD) % WORLD, mine[20]
        assert mine[20].sent_bytes and mine[20].received_bytes, mine[20]


def test_a_lost_pod_restores_from_its_peers_bitwise(
    saved: tuple[Path, list[str]], tmp_path: Path, warm_server: WarmServer
) -> None:
    base = _copy(saved, tmp_path)
    _lose_pod_1(base)
    results = _ranks(base, "restore", warm_server)
    for rank, result in enumerate(results):
        assert result["restored"] == [{"step": 20, "digest": saved[1][rank]}] * 2, (rank, result)
    restores = _restores(base)
    first = {e.rank: e.origin for e in restores[:WORLD]}
    assert first == {0: "memory", 1: "memory", 2: "peer", 3: "peer"}, restores
    # What came back is pod 1's own copy again: the next restore needs no peer.
    assert {e.rank: e.origin for e in restores[WORLD:]} == dict.fromkeys(range(WORLD), "memory"), restores


def test_a_damaged_peer_copy_is_not_loaded_and_storage_is_read(
    saved: tuple[Path, list[str]], tmp_path: Path, warm_server: WarmServer
) -> None:
    base = _copy(saved, tmp_path)
    kept = base / "shm" / "pod0" / "peer-rank2.bin"
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 0xFF
    kept.write_bytes(bytes(data))
    _lose_pod_1(base)
    results = _ranks(base, "restore", warm_server)
    for rank, result in enumerate(results):
        assert result["restored"][0] == {"step": 20, "digest": saved[1][rank]}, (rank, result)
    first = _restores(base)[:WORLD]
    assert {e.origin for e in first} == {"storage"}, first
    problem = next(e.memory_problem for e in first if e.rank == 2)
    assert problem is not None and "rank 0 kept" in problem and "does not match its hash" in problem, first


def test_a_missing_peer_copy_sends_every_rank_to_storage(
    saved: tuple[Path, list[str]], tmp_path: Path, warm_server: WarmServer
) -> None:
    base = _copy(saved, tmp_path)
    (base / "shm" / "pod0" / "peer-rank3.json").unlink()
    _lose_pod_1(base)
    results = _ranks(base, "restore", warm_server)
    for rank, result in enumerate(results):
        assert result["restored"][0] == {"step": 20, "digest": saved[1][rank]}, (rank, result)
    first = _restores(base)[:WORLD]
    assert {e.origin for e in first} == {"storage"}, first
    problems = {e.rank: e.memory_problem or "" for e in first}
    assert problems[3] == "slot 0: no header; slot 1: no header; " + (
        "rank(s) 3 have no copy of their own and no peer keeps one"
    ), problems
    assert problems[0] == "rank(s) 3 have no copy of their own and no peer keeps one", problems


def test_a_forged_peer_copy_is_not_sent_back_and_storage_is_read(
    saved: tuple[Path, list[str]], tmp_path: Path, warm_server: WarmServer
) -> None:
    """The copy pod 0 keeps for rank 2, with its extra replaced and its header sealed again with
    a key that is not pod 0's (a forger without the key): rank 0 does not count it as a copy it
    keeps (its MAC does not verify), so every rank reads storage."""
    import os

    import blake3

    base = _copy(saved, tmp_path)
    folder = base / "shm" / "pod0"
    (folder / "peer-rank2.extra").write_bytes(b"forged")
    header = json.loads((folder / "peer-rank2.json").read_text())
    key = os.urandom(32)
    header["extra_hash"] = blake3.blake3(b"forged", key=key).hexdigest()
    text = json.dumps({k: v for k, v in header.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
    header["mac"] = blake3.blake3(text.encode(), key=key).hexdigest()
    (folder / "peer-rank2.json").write_text(json.dumps(header))
    _lose_pod_1(base)
    results = _ranks(base, "restore", warm_server)
    for rank, result in enumerate(results):
        assert result["restored"][0] == {"step": 20, "digest": saved[1][rank]}, (rank, result)
    first = _restores(base)[:WORLD]
    assert {e.origin for e in first} == {"storage"}, first
    problem = next(e.memory_problem for e in first if e.rank == 2) or ""
    assert "rank(s) 2 have no copy of their own and no peer keeps one" in problem, first

"""Every rank of a job must restore the same step. Two gloo ranks save steps 10 and 20, then
restore; in the second restore rank 1's directory listing misses step 20, as when the commit of
step 20 (an earlier attempt's background thread, still running after an in-process restart's
abort) renames the folder between the two ranks' listings."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from support.worker_helpers import BIN, WarmServer, child_env, free_port_pair, run_ranks

pytestmark = pytest.mark.slow


def _two_ranks(tmp_path: Path, warm: WarmServer, script: str, *extra: list[str]) -> list[str]:
    """Run ``script RUN_DIR rank<N>.json [extra[N]...]`` as ranks 0 and 1; their outputs."""
    port = free_port_pair()
    envs = [
        child_env(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        for rank in (0, 1)
    ]
    argvs = [
        [
            sys.executable,
            str(BIN / script),
            str(tmp_path / "run"),
            str(tmp_path / f"rank{rank}.json"),
            *[e[rank] for e in extra],
        ]
        for rank in (0, 1)
    ]
    return run_ranks(argvs, envs, warm=warm)


def test_ranks_agree_on_the_restored_step_when_their_listings_differ(
    tmp_path: Path, warm_server: WarmServer
) -> None:
    _two_ranks(tmp_path, warm_server, "two_rank_restore.py", ["0", "20"])
    steps = [json.loads((tmp_path / f"rank{r}.json").read_text())["steps"] for r in (0, 1)]
    first, second = [s[0] for s in steps], [s[1] for s in steps]
    assert first == [20, 20]  # both listings complete: both restore step 20
    assert second[0] == second[1], f"rank 0 restored step {second[0]}, rank 1 step {second[1]}"


def test_ddp_restore_is_bitwise_and_a_damaged_shard_falls_back_on_every_rank(
    tmp_path: Path, warm_server: WarmServer
) -> None:
    """A DDP model (not FSDP): save and restore bitwise; then one byte of rank 1's shard of
    the newest checkpoint is flipped: both ranks report it and restore the one before."""
    _two_ranks(tmp_path, warm_server, "two_rank_ddp_corrupt.py")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for result in results:
        assert result["restored"] == [{"step": 20, "same": True}, {"step": 10, "same": True}], result
    corrupt = results[1]["corrupt"]
    assert {e["step"] for e in corrupt} == {20}, corrupt
    assert sorted({e["rank"] for e in corrupt}) == [0, 1], corrupt  # reported on every rank

"""The demo builds its model uninitialised when a checkpoint will overwrite it
(``ctx.restorable``), and initialises it afterwards when the restore found nothing: the model
then equals a normal build, with one rank and with two FSDP2 ranks (gloo)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from support.worker_helpers import BIN, WarmServer, child_env, free_port_pair, run_ranks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("world", [1, 2])
def test_an_uninitialised_build_then_initialised_equals_a_normal_build(
    tmp_path: Path, world: int, warm_server: WarmServer
) -> None:
    port = free_port_pair()
    envs = [
        child_env(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            **({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)} if world > 1 else {}),
        )
        for rank in range(world)
    ]
    argvs = [
        [sys.executable, str(BIN / "demo_build.py"), str(tmp_path / f"rank{rank}.json")]
        for rank in range(world)
    ]
    run_ranks(argvs, envs, warm=warm_server)
    for rank in range(world):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["same"] == [True] * 8, result  # 4 Linear layers: weight and bias
        assert result["optimizer_owns"], result
        assert set(result["types"]) == ({"DTensor"} if world > 1 else {"Parameter"}), result

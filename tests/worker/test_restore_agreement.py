"""Every rank of a job must restore the same step. Two gloo ranks save steps 10 and 20, then
restore; in the second restore rank 1's directory listing misses step 20, as when the commit of
step 20 (an earlier attempt's background thread, still running after an in-process restart's
abort) renames the folder between the two ranks' listings."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from worker_helpers import BIN, child_env, free_port_pair

pytestmark = pytest.mark.slow


def test_ranks_agree_on_the_restored_step_when_their_listings_differ(tmp_path: Path) -> None:
    port = free_port_pair()
    procs = []
    for rank in (0, 1):
        env = child_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
        env["MASTER_PORT"] = str(port)
        argv = [
            sys.executable,
            str(BIN / "two_rank_restore.py"),
            str(tmp_path / "run"),
            str(tmp_path / f"rank{rank}.json"),
            "20" if rank == 1 else "0",
        ]
        procs.append(
            subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=100)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    steps = [json.loads((tmp_path / f"rank{r}.json").read_text())["steps"] for r in (0, 1)]
    first, second = [s[0] for s in steps], [s[1] for s in steps]
    assert first == [20, 20]  # both listings complete: both restore step 20
    assert second[0] == second[1], f"rank 0 restored step {second[0]}, rank 1 step {second[1]}"

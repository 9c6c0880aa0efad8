"""The host-copy folders in ``[checkpoint] memory_dir``: the one of a launcher that was killed
outright (its ``finally`` never ran) is removed when the same run and node start again; those of
live launchers, of other runs and of other nodes are left alone."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from nvtrain.launcher.rundir import remove_stale_host_copies


def test_only_this_run_and_nodes_folders_of_dead_launchers_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", "nvtrain"], stdin=subprocess.PIPE
    )
    try:
        # Until it has exec'd, the child's command line is this test process's (no "nvtrain"):
        # the remover would rightly take it for another program's pid.
        deadline = time.monotonic() + 60
        while "nvtrain" not in psutil.Process(live.pid).cmdline():
            assert time.monotonic() < deadline, psutil.Process(live.pid).cmdline()
            time.sleep(0.01)
        names = {
            "stale": f"nvtrain-run-1-node0-{dead.pid}",
            "live": f"nvtrain-run-1-node0-{live.pid}",
            "other run": f"nvtrain-run-2-node0-{dead.pid}",
            "other node": f"nvtrain-run-1-node1-{dead.pid}",
        }
        for name in names.values():
            (tmp_path / name).mkdir()
            (tmp_path / name / "rank0.slot0.bin").write_bytes(b"x" * 10)
        mine = tmp_path / "nvtrain-run-1-node0-999999999"
        removed = remove_stale_host_copies(mine)
        assert removed == [tmp_path / names["stale"]]
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted(n for k, n in names.items() if k != "stale")
    finally:
        assert live.stdin is not None
        live.stdin.close()
        live.wait()

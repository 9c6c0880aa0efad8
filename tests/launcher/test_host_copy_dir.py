"""The host-copy folders in ``[checkpoint] memory_dir``: the one of a launcher that was killed
outright (its ``finally`` never ran) is removed when the same run and node start again; those of
live launchers, of other runs and of other nodes are left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

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


NOBODY = 65534


def test_a_stale_looking_folder_of_another_user_or_a_link_is_never_removed(tmp_path: Path) -> None:
    """Another user may put a folder (or a link) of a dead launcher's name in the shared
    memory-backed folder: it is not this user's to remove, and a link is not followed."""
    if os.geteuid() != 0:
        pytest.skip("making a folder of another user's needs root")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    theirs = tmp_path / f"nvtrain-run-1-node0-{dead.pid}"
    theirs.mkdir(mode=0o700)
    (theirs / "rank0.slot0.bin").write_bytes(b"x" * 10)
    os.chown(theirs, NOBODY, NOBODY)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_bytes(b"y")
    other_dead = subprocess.Popen([sys.executable, "-c", "pass"])
    other_dead.wait()
    link = tmp_path / f"nvtrain-run-1-node0-{other_dead.pid}"
    link.symlink_to(target, target_is_directory=True)

    assert remove_stale_host_copies(tmp_path / "nvtrain-run-1-node0-999999999") == []
    assert (theirs / "rank0.slot0.bin").read_bytes() == b"x" * 10
    assert link.is_symlink() and (target / "keep").read_bytes() == b"y"

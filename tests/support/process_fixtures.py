"""Fixtures of the tests that start ``nvtrain run`` as real processes (``nvtrain``, ``mount``);
the helpers live in ``proc_helpers.py``. Registered for every folder by ``tests/conftest.py``."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.proc_helpers import Mount, NvtrainRunner, _not_here


@pytest.fixture
def nvtrain(tmp_path: Path) -> Iterator[NvtrainRunner]:
    """Starts ``nvtrain run`` children; kills whatever they left when the test ends."""
    runner = NvtrainRunner(tmp_path)
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Mount]:
    """``mount("2m")`` mounts a tmpfs of that size under ``tmp_path`` (a volume a test can fill);
    all are unmounted after. Skipped where mounting is impossible, failed there in CI."""
    if shutil.which("mount") is None or shutil.which("umount") is None:
        _not_here("needs mount and umount (util-linux) to make a small volume that can be filled")
    mounted: list[Path] = []

    def make(size: str) -> Path:
        path = tmp_path / f"vol{len(mounted)}"
        path.mkdir()
        done = run_cmd("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
        if done.returncode != 0:
            _not_here(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
        mounted.append(path)
        return path

    try:
        yield make
    finally:
        for path in mounted:
            run_cmd("umount", "-l", str(path))


def run_cmd(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)

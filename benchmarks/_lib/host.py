"""The machine a benchmark ran on: CPU, versions, git HEAD, load, the checkpoint disk's rate."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from _lib import REPO


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else ``platform.processor()``."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def version(dist: str) -> str | None:
    """An installed distribution's version, None if it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_head(*, mark_dirty: bool = True) -> str | None:
    """This checkout's short HEAD, `` (src modified)`` appended when ``src`` has changes (and
    ``mark_dirty``); None outside a git checkout."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not mark_dirty:
            return head
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "src"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return head + (" (src modified)" if dirty else "")
    return None


def machine() -> dict[str, Any]:
    """Date, CPUs, Python, torch, NVRx, nvtrain (and its git HEAD), load average now."""
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "nvidia-resiliency-ext": version("nvidia-resiliency-ext"),
        "nvtrain": version("nvtrain"),
        "nvtrain_git": git_head(),
        "loadavg_start": os.getloadavg(),
    }


def disk_rate(folder: Path, gigabytes: float) -> float:
    """Sequential write rate (GB/s) of ``folder``'s disk: ``gigabytes`` in 64 MiB writes, fsync."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".disk-rate"
    block = os.urandom(64 << 20)
    count = max(1, round(gigabytes * 1e9 / len(block)))
    t0 = time.monotonic()
    with path.open("wb") as handle:
        for _ in range(count):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
    seconds = time.monotonic() - t0
    path.unlink()
    return count * len(block) / seconds / 1e9

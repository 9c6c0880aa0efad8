"""What ``nvtrain env`` reports: the environment nvtrain finds on this machine.

The versions of nvtrain, Python, torch, NVRx and the frameworks the integrations adapt, what
torch sees of CUDA and the GPUs, and the platform ``nvtrain run`` would take this for
(Kubernetes pod, Slurm task, bare metal), in the order a bug report wants them. Each entry is
found on its own: a package that is missing or fails to import is reported as such, never
raised. torch is imported (for CUDA and the GPUs) only when ``with_torch``.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import sys
import warnings
from collections.abc import Mapping
from importlib import metadata

from nvtrain.launcher.identity import on_kubernetes, slurm_step
from nvtrain.nvrx import inprocess as nvrx_inprocess
from nvtrain.nvrx import installed_nvrx

__all__ = ["FRAMEWORKS", "Entry", "describe"]

FRAMEWORKS = ("transformers", "lightning", "accelerate", "pydantic", "typer", "rich")
"""Other packages whose versions a report needs (the integrations' frameworks, the CLI's)."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One line of the report: ``key`` (a JSON key), its ``value`` in words."""

    key: str
    value: str


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _platform(env: Mapping[str, str]) -> str:
    if on_kubernetes(env):
        index = env.get("JOB_COMPLETION_INDEX", "").strip()
        return "Kubernetes pod" + (f" (Indexed Job, index {index})" if index else "")
    try:
        step = slurm_step(env)
    except Exception as exc:  # noqa: BLE001 - a broken Slurm environment is itself the finding
        return f"Slurm task (its variables do not add up: {exc})"
    if step is not None:
        return f"Slurm task (job {step.job_id}, node {step.node_rank} of {step.nodes})"
    return "bare metal (no Kubernetes or Slurm variables)"


def _nvrx() -> str:
    version = installed_nvrx()
    if version is None:
        return "not installed"
    tested = "tested" if version.tested else "not a tested version"
    inprocess = "in-process restart available" if nvrx_inprocess.available() else "no in-process restart"
    return f"{version} ({tested}; {inprocess})"


def _torch() -> list[Entry]:
    try:
        with warnings.catch_warnings():
            # torch.cuda's import of the deprecated pynvml package warns on every import.
            warnings.filterwarnings("ignore", category=FutureWarning, message=".*pynvml.*")
            import torch
    except Exception as exc:  # noqa: BLE001 - a torch that fails to import is what to report
        return [Entry("torch", f"fails to import: {type(exc).__name__}: {exc}")]
    entries = [Entry("torch", str(torch.__version__))]
    cuda = torch.version.cuda
    entries.append(Entry("torch_cuda_build", cuda or "none (a CPU build)"))
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        names = [torch.cuda.get_device_name(i) for i in range(count)]
    except Exception as exc:  # noqa: BLE001 - a driver problem is what to report
        return [*entries, Entry("gpus", f"CUDA fails: {type(exc).__name__}: {exc}")]
    gpus = ", ".join(f"{n} x {name}" for name, n in _counted(names).items()) if names else "none"
    entries.append(Entry("gpus", gpus))
    nccl = "none"
    if count and torch.distributed.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
    entries.append(Entry("nccl", nccl))
    return entries


def _counted(names: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return counts


def _cpus() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    total = os.cpu_count()
    return str(total) if usable in (None, total) else f"{usable} usable of {total}"


def _shm() -> str:
    try:
        usage = shutil.disk_usage("/dev/shm")
    except OSError:
        return "none"
    return f"{usage.total / 2**30:.1f} GiB ({usage.free / 2**30:.1f} GiB free)"


def describe(env: Mapping[str, str] | None = None, *, with_torch: bool = True) -> list[Entry]:
    """The report's entries, in order."""
    from nvtrain import __version__

    env = os.environ if env is None else env
    libc, libc_version = platform.libc_ver()
    entries = [
        Entry("nvtrain", __version__),
        Entry("python", f"{platform.python_version()} ({sys.executable})"),
        Entry("os", f"{platform.system()} {platform.release()} {platform.machine()}"),
        Entry("libc", f"{libc} {libc_version}".strip() or "unknown"),
        Entry("platform", _platform(env)),
        Entry("cpus", _cpus()),
        Entry("dev_shm", _shm()),
        Entry("nvrx", _nvrx()),
    ]
    if with_torch:
        entries += _torch()
    entries += [Entry(name, _version(name)) for name in FRAMEWORKS]
    return entries

"""The run's files on this node: the plan and the paths (``prepare``, which writes nothing, for
``--dry-run`` too), and the state written before ft_launcher starts (``write_state``), with the
checks that turn an unwritable checkpoint volume into a usage error at start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.launcher.identity import Identity
from nvtrain.launcher.plan import FT_CONFIG_NAME, LaunchPlan, build_plan, ft_config_text, uses_worker_library
from nvtrain.nvrx import NvrxVersion, installed_nvrx
from nvtrain.runlog.files import pod_events_file

__all__ = [
    "RunPaths",
    "host_copy_dir",
    "os_error_text",
    "prepare",
    "remove_stale_host_copies",
    "remove_state",
    "unwritable_run_dir",
    "write_state",
]

_PROBE_BYTES = 64 << 10
"""Written (and synced) into the run's folder at start: a full volume fails here, not later."""


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """Files of one run on this node."""

    run_dir: Path
    """``<checkpoint dir>/<run id>``: shared by every pod (events log, checkpoints)."""
    events: Path
    """``events-node<N>.jsonl`` in the run directory: this pod's events log (its launcher's and
    workers' events; ``nvtrain.runlog`` merges every pod's)."""
    state_dir: Path
    """Node-local: the resolved policy handed to the workers."""
    policy: Path
    host_copy: Path | None = None
    """Node-local, memory-backed (``[checkpoint] memory_dir``): each rank's staged checkpoint,
    kept for the workers that replace it; None when the policy keeps no such copy."""
    ft_config: Path | None = None
    """Node-local: NVRx's fault-tolerance config from ``[heartbeat]`` (``--ft-cfg-path``)."""


def host_copy_dir(policy: Policy, identity: Identity) -> Path | None:
    """``<memory_dir>/nvtrain-<run id>-node<N>-<pid>``, when async saves keep a host copy."""
    c = policy.checkpoint
    if not (c.async_ and c.in_memory and c.memory_dir):
        return None
    return Path(c.memory_dir) / f"nvtrain-{identity.run_id}-node{identity.node_rank}-{os.getpid()}"


def prepare(
    policy: Policy,
    identity: Identity,
    *,
    extra_args: tuple[str, ...] = (),
    launcher_options: tuple[str, ...] = (),
    nvrx: NvrxVersion | None = None,
    python: str = sys.executable,
) -> tuple[LaunchPlan, RunPaths]:
    """The plan and the paths of this run; writes nothing (``--dry-run`` prints the plan).
    Reads the entrypoint's source, to tell whether it uses nvtrain's worker library."""
    version = nvrx or installed_nvrx()
    if version is None:
        raise UsageError(
            "NVRx (nvidia-resiliency-ext) is not installed in this environment",
            "install it in the training image: pip install 'nvtrain[worker]'",
        )
    run_dir = Path(policy.checkpoint.dir) / identity.run_id
    # One folder per launcher process: a second launcher of the same run and node on this
    # machine (a test, a stray local start) must not overwrite or delete this one's policy.
    state = Path(tempfile.gettempdir()) / f"nvtrain-{identity.run_id}-node{identity.node_rank}-{os.getpid()}"
    host = host_copy_dir(policy, identity)
    paths = RunPaths(
        run_dir,
        pod_events_file(run_dir, identity.node_rank),
        state,
        state / "policy.json",
        host,
        state / FT_CONFIG_NAME,
    )
    plan = build_plan(
        policy,
        identity,
        version,
        python=python,
        policy_path=str(paths.policy),
        events_path=str(paths.events),
        extra_args=extra_args,
        launcher_options=launcher_options,
        host_copy_path=str(host) if host else None,
        zygote_path=str(state / "zygote.sock"),
        ft_config_path=str(paths.ft_config),
        worker_library=uses_worker_library(policy.job),
    )
    return plan, paths


def write_state(policy: Policy, paths: RunPaths) -> None:
    """Write the resolved policy (JSON) that the workers read through ``NVTRAIN_POLICY``, and
    NVRx's fault-tolerance config that ft_launcher reads (``--ft-cfg-path``), after checking
    that the run's folder can be written, with room to spare (so a refused start leaves
    nothing). A storage error is a ``UsageError`` (exit 2) naming the key and the fix."""
    created = not paths.run_dir.exists()
    try:
        paths.run_dir.mkdir(parents=True, exist_ok=True)
        _probe(paths.run_dir)
    except OSError as exc:
        if created:
            with contextlib.suppress(OSError):
                paths.run_dir.rmdir()
        raise unwritable_run_dir(policy, paths.run_dir, exc) from None
    try:
        paths.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = paths.policy.with_suffix(".tmp")
        tmp.write_text(policy.model_dump_json(by_alias=True), encoding="utf-8")
        os.replace(tmp, paths.policy)
        if paths.ft_config is not None:
            paths.ft_config.write_text(ft_config_text(policy.heartbeat), encoding="utf-8")
    except OSError as exc:
        shutil.rmtree(paths.state_dir, ignore_errors=True)
        raise UsageError(
            f"cannot write the run's state folder {paths.state_dir} in $TMPDIR: {os_error_text(exc)}",
            "free space in $TMPDIR, or point TMPDIR at a writable folder with room",
        ) from None
    if paths.host_copy is not None:
        remove_stale_host_copies(paths.host_copy)
        try:
            paths.host_copy.mkdir(mode=0o700, parents=False, exist_ok=True)
        except OSError as exc:
            shutil.rmtree(paths.state_dir, ignore_errors=True)
            raise UsageError(
                f"[checkpoint] memory_dir = {json.dumps(policy.checkpoint.memory_dir)}: cannot make "
                f"the folder {paths.host_copy}: {os_error_text(exc)}",
                "mount memory-backed storage there (an emptyDir with medium: Memory at /dev/shm), "
                'or set memory_dir = "" to keep the copy in the worker only',
            ) from None


def remove_stale_host_copies(mine: Path) -> list[Path]:
    """Remove the host-copy folders of this run and node that a launcher killed outright (no
    ``finally`` ran: SIGKILL, an OOM kill of the container) left in the memory-backed folder,
    where they would hold two copies of every rank's state until the pod ends. A folder counts
    as stale when no ``nvtrain`` process has the pid in its name. Returns those removed."""
    prefix, _, _pid = mine.name.rpartition("-")
    removed = []
    with contextlib.suppress(OSError):
        for entry in mine.parent.iterdir():
            head, _, pid = entry.name.rpartition("-")
            if head != prefix or not pid.isdigit() or entry == mine or _is_nvtrain(int(pid)):
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _is_nvtrain(pid: int) -> bool:
    import psutil

    try:
        return any("nvtrain" in part for part in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def remove_state(paths: RunPaths) -> None:
    """Remove this node's state folder and host copies (the run has ended)."""
    shutil.rmtree(paths.state_dir, ignore_errors=True)
    if paths.host_copy is not None:
        shutil.rmtree(paths.host_copy, ignore_errors=True)


def _probe(folder: Path) -> None:
    """Write ``_PROBE_BYTES`` into ``folder`` and sync them, then remove the file. The name is
    unique: pods share the folder, and a pod's pid may well be another pod's."""
    probe = folder / f".write-test-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            data = memoryview(bytes(_PROBE_BYTES))
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def os_error_text(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the errno's text and name."""
    code = errno.errorcode.get(exc.errno or 0, "")
    return (exc.strerror or str(exc)) + (f" ({code})" if code else "")


_STORAGE_FIXES = {
    errno.ENOSPC: "free space on that volume (old runs' checkpoints) or give it more, or point "
    "[checkpoint] dir at a volume with room",
    errno.EDQUOT: "raise the volume's quota or free space in it, or point [checkpoint] dir at a "
    "volume with room",
    errno.EROFS: "mount the checkpoint volume read-write (readOnly: false in the pod's volumeMounts), "
    "or point [checkpoint] dir at writable storage",
    errno.EACCES: "let the pod's user write there (e.g. the pod's securityContext fsGroup), or point "
    "[checkpoint] dir at storage this pod can write",
}
_STORAGE_FIXES[errno.EPERM] = _STORAGE_FIXES[errno.EACCES]
_ANY_STORAGE_FIX = "point [checkpoint] dir at storage this pod can write (the shared checkpoint volume)"


def unwritable_run_dir(policy: Policy, run_dir: Path, exc: OSError) -> UsageError:
    """The run's folder cannot be written at start: a usage error (exit 2) with the fix."""
    return UsageError(
        f"[checkpoint] dir = {json.dumps(policy.checkpoint.dir)}: cannot write the run's "
        f"folder {run_dir}: {os_error_text(exc)}",
        _STORAGE_FIXES.get(exc.errno or 0, _ANY_STORAGE_FIX),
    )

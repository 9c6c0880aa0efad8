"""The run's files on this node: the plan and the paths (``prepare``, which writes nothing, for
``--dry-run`` too), and the state written before ft_launcher starts (``write_state``), with the
checks that turn an unwritable checkpoint volume, or a folder that another user made or can
enter, into a usage error at start.

Every folder made here is made through ``nvtrain.private``: at mode 0700, and one that exists
already is used only when it is this user's and closed to others (the run's folder on the shared
checkpoint volume: not writable by group or others), in folders that are safe from ``/`` down
(``private.unsafe_ancestor``). The node-local folders' names end in a random part, so another
user cannot make them first. A refused start removes what it made and nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import secrets
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from nvtrain import private
from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.launcher.identity import Identity
from nvtrain.launcher.plan import FT_CONFIG_NAME, LaunchPlan, build_plan, ft_config_text, uses_worker_library
from nvtrain.nvrx import NvrxVersion, installed_nvrx
from nvtrain.runlog.files import pod_events_file

__all__ = [
    "RunPaths",
    "host_copy_dir",
    "launcher_tmpdir",
    "os_error_text",
    "prepare",
    "remove_stale_host_copies",
    "remove_stale_states",
    "remove_state",
    "unwritable_run_dir",
    "write_state",
]

_PROBE_BYTES = 64 << 10
"""Written (and synced) into the run's folder at start: a full volume fails here, not later."""
RUN_KEY_NAME = "run.key"
"""The run's secret in the state folder (``private.write_run_key``; ``$NVTRAIN_RUN_KEY_FILE``)."""
MAX_SOCKET_DIR = 72
"""The longest ``$TMPDIR`` for ft_launcher: NVRx 0.4 binds ``$TMPDIR/_ft_launcher<pid>_rmon<local
rank>.socket`` (35 more bytes with a 7-digit pid and local ranks below 1000), and a Unix socket's
path holds at most 107 bytes."""


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
    launcher_tmp: Path | None = None
    """Node-local, private: ft_launcher's and the warm-start server's ``$TMPDIR`` (NVRx's IPC
    sockets, torch elastic's log folder), ``<state folder>/tmp`` unless that path is too long
    for a socket's (``launcher_tmpdir``); removed with the state. None: the launcher's own."""
    made: list[Path] = dataclasses.field(default_factory=list, compare=False, repr=False)
    """The folders ``write_state`` made (not those it found): a refused start removes them."""

    @property
    def run_key(self) -> Path:
        """The run's secret, a private file in the state folder (``$NVTRAIN_RUN_KEY_FILE``)."""
        return self.state_dir / RUN_KEY_NAME


def _node_folder_name(identity: Identity) -> str:
    """``nvtrain-<run id>-node<N>-<pid>-<random>``: the pid tells a killed launcher's folder
    (``remove_stale_states``); the random part keeps another user from making it first."""
    return f"nvtrain-{identity.run_id}-node{identity.node_rank}-{os.getpid()}-{secrets.token_hex(4)}"


def host_copy_dir(policy: Policy, identity: Identity) -> Path | None:
    """``<memory_dir>/nvtrain-<run id>-node<N>-<pid>-<random>``, when async saves keep a host
    copy."""
    c = policy.checkpoint
    if not (c.async_ and c.in_memory and c.memory_dir):
        return None
    return Path(c.memory_dir) / _node_folder_name(identity)


def launcher_tmpdir(state: Path) -> Path:
    """ft_launcher's private ``$TMPDIR``: ``<state>/tmp``, or when that is longer than
    ``MAX_SOCKET_DIR`` (a long ``$TMPDIR`` or run id) a folder of a random name beside the state
    folder, else in ``/tmp``. ``write_state`` makes it at 0700."""
    inside = state / "tmp"
    if len(str(inside)) <= MAX_SOCKET_DIR:
        return inside
    name = f"nvtrain-{os.getpid()}-{secrets.token_hex(4)}"
    beside = state.parent / name
    return beside if len(str(beside)) <= MAX_SOCKET_DIR else Path("/tmp") / name


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
    state = Path(tempfile.gettempdir()) / _node_folder_name(identity)
    host = host_copy_dir(policy, identity)
    paths = RunPaths(
        run_dir,
        pod_events_file(run_dir, identity.node_rank),
        state,
        state / "policy.json",
        host,
        state / FT_CONFIG_NAME,
        launcher_tmpdir(state),
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
        run_key_path=str(paths.run_key),
        launcher_tmp=str(paths.launcher_tmp),
        user_tmpdir=os.environ.get("TMPDIR", ""),
    )
    return plan, paths


def write_state(policy: Policy, paths: RunPaths) -> None:
    """Make the run's folder (checked writable, with room to spare), this node's private state
    folder with the resolved policy (JSON) that the workers read through ``NVTRAIN_POLICY``,
    NVRx's fault-tolerance config that ft_launcher reads (``--ft-cfg-path``), the run's secret
    (``run.key``) and ft_launcher's private ``$TMPDIR``, then the host-copy folder. A storage
    error, or a folder that another user made or can enter, is a ``UsageError`` (exit 2) naming
    the key or variable and the fix; the folders this start made are then removed, and a refused
    folder is neither used nor touched."""
    try:
        _make_run_dir(policy, paths)
        _make_state(policy, paths)
        if paths.host_copy is not None:
            _make_host_copy(policy, paths, paths.host_copy)
    except BaseException:
        _remove_made(paths)
        raise


def _make_run_dir(policy: Policy, paths: RunPaths) -> None:
    """``<checkpoint dir>/<run id>``, shared by the job's pods (so it may exist): made at 0700;
    one that exists must be this user's, not a link, and not writable by group or others."""
    try:
        # Every folder above must be safe before one is made in it (and again after: make_private_dir).
        unsafe = private.unsafe_ancestor(paths.run_dir.parent, below=paths.run_dir)
        if unsafe is not None:
            raise unsafe
        _make_parents(paths.run_dir.parent)
        if private.make_private_dir(paths.run_dir, closed=0o022):
            paths.made.append(paths.run_dir)
        _probe(paths.run_dir)
    except private.NotPrivate as exc:
        raise UsageError(
            f"[checkpoint] dir = {json.dumps(policy.checkpoint.dir)}: the run's folder {exc.path} "
            f"{exc.reason}; nvtrain uses a run folder only when it is this user's and not "
            "writable by group or others (another user could plant files the workers load)",
            _parent_fix(
                exc,
                "point [checkpoint] dir at a folder whose every folder from / down is root's or this user's",
            )
            or f"remove {exc.path} (look at what is in it first), or make it this user's and closed "
            "(chown, chmod go-w), or start with another run id",
        ) from None
    except OSError as exc:
        raise unwritable_run_dir(policy, paths.run_dir, exc) from None


def _make_parents(folder: Path) -> None:
    """Make ``folder`` and the folders above it that are missing at 0755 whatever the umask (a
    umask of 000 would leave them open to all, and the run's folder in one is refused)."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:  # another pod made it meanwhile
            continue
        os.chmod(path, 0o755)


def _make_state(policy: Policy, paths: RunPaths) -> None:
    state = paths.state_dir
    remove_stale_states(state.parent, mine=state)
    try:
        if private.make_private_dir(state):
            paths.made.append(state)
        if paths.launcher_tmp is not None:
            # Inside the state folder it may be left from a launcher of the same pid (a container
            # restarted with its $TMPDIR); beside it, the name is random: anything there is not ours.
            inside = paths.launcher_tmp.parent == state
            if private.make_private_dir(paths.launcher_tmp, exist_ok=inside) and not inside:
                paths.made.append(paths.launcher_tmp)
        tmp = paths.policy.with_suffix(".tmp")
        # An interval the policy leaves unset stays unset for the workers (the framework
        # integrations then pick one that fits the run: integrations/cadence.py); they read the
        # same default when they validate it.
        unset = None if "interval" in policy.checkpoint.model_fields_set else {"checkpoint": {"interval"}}
        tmp.write_text(policy.model_dump_json(by_alias=True, exclude=unset), encoding="utf-8")
        os.replace(tmp, paths.policy)
        if paths.ft_config is not None:
            paths.ft_config.write_text(ft_config_text(policy.heartbeat), encoding="utf-8")
        with contextlib.suppress(FileNotFoundError):  # a key of an earlier launcher of this pid
            paths.run_key.unlink()
        private.write_run_key(paths.run_key)
    except private.NotPrivate as exc:
        what = "the run's state folder" if exc.path == state else "ft_launcher's temporary folder"
        raise UsageError(
            f"$TMPDIR ({state.parent}): {what} {exc.path} {exc.reason}; nvtrain uses a state "
            "folder only when this user made it and no one else can enter it (another user could "
            "read the run's key or change what ft_launcher reads)",
            _parent_fix(exc, "point TMPDIR at a folder that only this user can write")
            or f"remove {exc.path} (look at what is in it first), or point TMPDIR at a folder that "
            "only this user can write",
        ) from None
    except OSError as exc:
        raise UsageError(
            f"cannot write the run's state folder {state} in $TMPDIR: {os_error_text(exc)}",
            "free space in $TMPDIR, or point TMPDIR at a writable folder with room",
        ) from None


def _make_host_copy(policy: Policy, paths: RunPaths, folder: Path) -> None:
    remove_stale_host_copies(folder)
    memory_dir = json.dumps(policy.checkpoint.memory_dir)
    try:
        if private.make_private_dir(folder):
            paths.made.append(folder)
    except private.NotPrivate as exc:
        raise UsageError(
            f"[checkpoint] memory_dir = {memory_dir}: the host-copy folder {exc.path} {exc.reason}; "
            "nvtrain uses a host-copy folder only when this user made it and no one else can "
            "enter it (another user could plant a checkpoint the workers restore)",
            _parent_fix(exc, "set memory_dir to a folder that only this user can write")
            or f"remove {exc.path} (look at what is in it first), or set memory_dir to a folder that "
            'only this user can write, or memory_dir = "" to keep the copy in the worker only',
        ) from None
    except OSError as exc:
        raise UsageError(
            f"[checkpoint] memory_dir = {memory_dir}: cannot make the folder {folder}: {os_error_text(exc)}",
            "mount memory-backed storage there (an emptyDir with medium: Memory at /dev/shm), "
            'or set memory_dir = "" to keep the copy in the worker only',
        ) from None


def _parent_fix(exc: private.NotPrivate, elsewhere: str) -> str:
    """The fix when the fault is a folder above (``exc.parent``), else ""."""
    if not exc.parent:
        return ""
    return f"{exc.fix}, or {elsewhere}" if exc.fix else elsewhere


def remove_stale_host_copies(mine: Path) -> list[Path]:
    """Remove the host-copy folders of this run and node that a launcher killed outright (no
    ``finally`` ran: SIGKILL, an OOM kill of the container) left in the memory-backed folder,
    where they would hold two copies of every rank's state until the pod ends. A folder counts
    as stale when no ``nvtrain`` process has the pid in its name (or it is this process's pid:
    a container restarted with the same pid), and only a folder of this
    user's (never a link, nor another user's folder of that name). Returns those removed."""
    named = _COPY_NAME.fullmatch(mine.name)
    assert named is not None, mine
    removed = []
    with contextlib.suppress(OSError):
        for entry in mine.parent.iterdir():
            match = _COPY_NAME.fullmatch(entry.name)
            if match is None or match.group(1) != named.group(1) or entry == mine:
                continue
            pid = int(match.group(2))
            if pid != os.getpid() and _is_nvtrain(pid):
                continue
            if private.check_private_dir(entry, closed=0) is not None:
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


_COPY_NAME = re.compile(r"(nvtrain-.+-node\d+)-(\d+)(?:-[0-9a-f]{8})?")
"""A host-copy folder (``nvtrain-<run id>-node<N>-<pid>-<random>``, or without the random part
as earlier versions named it): the run and node, and the pid."""
_STATE_NAME = re.compile(r"nvtrain-.+-node\d+-(\d+)(?:-[0-9a-f]{8})?|nvtrain-(\d+)-[0-9a-f]{8}")
"""A state folder (``nvtrain-<run id>-node<N>-<pid>-<random>``) or a launcher's ``$TMPDIR``
beside it (``nvtrain-<pid>-<random>``, ``launcher_tmpdir``)."""


def remove_stale_states(folder: Path, *, mine: Path | None = None) -> list[Path]:
    """Remove the state folders in ``folder`` (``$TMPDIR``) that launchers killed outright
    (SIGKILL, an OOM kill: no ``finally`` ran) left behind, with their secrets and sockets: a
    folder of this user's, private (never a link, nor another user's), named after a pid that
    no ``nvtrain`` process has, or this process's pid (an earlier launcher of a container
    restarted with the same pid). ``mine`` (this launcher's) is kept. Returns those removed."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            match = _STATE_NAME.fullmatch(entry.name)
            if match is None or entry == mine:
                continue
            pid = int(match.group(1) or match.group(2))
            if (pid != os.getpid() and _is_nvtrain(pid)) or private.check_private_dir(entry) is not None:
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
    """Remove this node's state folder, ft_launcher's ``$TMPDIR`` and the host copies (the run
    has ended, or did not start), and the run's folder if this start made it and it is still
    empty. Only folders of this user's that are closed to others (``write_state`` made or
    accepted them): never one it refused."""
    for folder in (paths.state_dir, paths.host_copy):
        if folder is not None and (folder in paths.made or private.check_private_dir(folder) is None):
            shutil.rmtree(folder, ignore_errors=True)
    _remove_made(paths)


def _remove_made(paths: RunPaths) -> None:
    """Remove the folders this start made (``paths.made``), and nothing else: the run's folder
    only while it is empty (another pod may have written into it by now)."""
    for folder in reversed(paths.made):
        if folder == paths.run_dir:
            with contextlib.suppress(OSError):
                folder.rmdir()
        else:
            shutil.rmtree(folder, ignore_errors=True)
    paths.made.clear()


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

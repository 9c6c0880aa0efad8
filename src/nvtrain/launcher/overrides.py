"""What ``nvtrain run``'s command line changes in the policy, and the policy of ``nvtrain run train.py``.

torchrun's everyday flags (``--nproc-per-node``, ``--nnodes``, ``--max-restarts``,
``--standalone``, ``--master-port``) override the policy's keys: the command line beats the file.
The overridden policy goes through the file's own checks again; a problem with a key a flag set
is reported against that flag. A training script named on the command line (``nvtrain run
train.py ARGS`` or ``-m MODULE``) runs with a default policy (``script_policy_data``), or
replaces ``[job] script``/``module``/``args`` of a policy given with ``--policy``.

A one-node job whose rendezvous port is not written anywhere (the file, ``--master-port``) gets
a free port (``ports.free_port``), as ``torchrun --standalone`` does, so that two one-node jobs
can run side by side on one machine. Multi-node jobs keep ``[rendezvous] port`` (29500 by
default): every pod must dial the same one.

torchrun's log options (``--tee``, ``--redirects``, ``--log-dir``, ``--local-ranks-filter``)
are ft_launcher's too; ``launcher_options`` checks them and spells them for ft_launcher.

Off Kubernetes: ``--master-addr`` and ``--rdzv-endpoint HOST[:PORT]`` set ``[rendezvous] host``
(and ``port``); under Slurm the step's node count and workers per node
(``launcher.slurm``) stand in for ``[rendezvous] nodes`` and ``[job] nproc_per_node`` where
neither the file nor a flag sets them. Paths are resolved against the directory ``nvtrain run``
started in (``config.paths``): a relative ``[checkpoint] dir``, and ``[job] script`` (so that
the script's ``__file__`` is absolute, as under ``python`` and torchrun); and off a pod, a
policy that does not set ``[checkpoint] dir`` keeps its checkpoints in ``$TMPDIR/nvtrain``
(``script_checkpoint_dir``), as the script form does, not in ``/checkpoints`` at the
filesystem's root. Such a default folder (and the demo's ``/tmp/nvtrain-demo``) that another
user has made first is not used: the run takes a fresh folder of this user's beside it and says
so in one line (``private.claim_default``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from nvtrain import private
from nvtrain.config.checks import check
from nvtrain.config.demo import DEMO_CHECKPOINT_DIR, DEMO_POLICY_SOURCE
from nvtrain.config.derive import derive_defaults
from nvtrain.config.load import validate_data
from nvtrain.config.paths import resolve_path, resolve_relative
from nvtrain.config.schema import Policy
from nvtrain.config.validation import validate_file
from nvtrain.errors import ConfigError, UsageError
from nvtrain.findings import Finding
from nvtrain.launcher.ports import free_port
from nvtrain.launcher.slurm import SlurmStep, check_job_size
from nvtrain.nvrx import installed_nvrx

__all__ = [
    "RDZV_BACKENDS",
    "on_this_node",
    "Overrides",
    "parse_endpoint",
    "Resolved",
    "is_script",
    "job_name_for",
    "launcher_options",
    "parse_nnodes",
    "parse_nproc",
    "resolve",
    "resolve_run",
    "script_checkpoint_dir",
]

Nproc = int | Literal["gpu", "cpu"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Overrides:
    """The policy keys the command line sets; None (or False) leaves the policy's value."""

    nproc_per_node: Nproc | None = None
    """``--nproc-per-node``: ``[job] nproc_per_node``."""
    nnodes: tuple[int, int] | None = None
    """``--nnodes MIN:MAX`` (``N`` is ``N:N``): ``[rendezvous] min_nodes`` and ``nodes``."""
    max_restarts: int | None = None
    """``--max-restarts``: ``[restart.in_job] max_restarts``."""
    standalone: bool = False
    """``--standalone``: one node, and a free port unless ``master_port`` is given."""
    master_port: int | None = None
    """``--master-port``: ``[rendezvous] port``."""
    script: str | None = None
    """The training script named on the command line: ``[job] script``."""
    module: str | None = None
    """``-m MODULE``: ``[job] module``."""
    script_args: tuple[str, ...] = ()
    """With ``script`` or ``module``: ``[job] args``."""
    no_warm_start: bool = False
    """``--no-warm-start``: ``[job] warm_start = false``."""
    master_addr: str | None = None
    """``--master-addr``, or the host of ``--rdzv-endpoint``: ``[rendezvous] host``."""
    endpoint: str | None = None
    """``--rdzv-endpoint`` as typed, when it gave ``master_addr`` (and ``master_port``)."""
    env_nodes: tuple[int, str] | None = None
    """(count, how to name it): Slurm's node count, for ``[rendezvous] nodes`` when neither the
    file nor ``--nnodes`` sets it."""
    env_nproc: tuple[int, str] | None = None
    """(count, how to name it): Slurm's workers per node, for ``[job] nproc_per_node`` when
    neither the file nor ``--nproc-per-node`` sets it."""

    def flags(self) -> dict[tuple[str, str], str]:
        """``{(table, key): flag as typed}`` for every key these overrides set."""
        found: dict[tuple[str, str], str] = {}
        if self.nproc_per_node is not None:
            found["job", "nproc_per_node"] = f"--nproc-per-node {self.nproc_per_node}"
        self._rendezvous_flags(found)
        if self.env_nproc is not None:
            found.setdefault(("job", "nproc_per_node"), f"{self.env_nproc[1]} {_FROM_ENV}")
        if self.max_restarts is not None:
            found["restart.in_job", "max_restarts"] = f"--max-restarts {self.max_restarts}"
        if self.no_warm_start:
            found["job", "warm_start"] = "--no-warm-start"
        entry = f"-m {self.module}" if self.module is not None else self.script
        if entry is not None:
            for key in ("script", "module", "args"):
                found["job", key] = entry
        return found

    def _rendezvous_flags(self, found: dict[tuple[str, str], str]) -> None:
        """Add to ``found`` (``flags``) the ``[rendezvous]`` keys these overrides set."""
        if self.standalone:
            for key in ("nodes", "min_nodes", "port"):
                found["rendezvous", key] = "--standalone"
        if self.nnodes is not None:
            low, high = self.nnodes
            text = f"--nnodes {high}" if low == high else f"--nnodes {low}:{high}"
            found["rendezvous", "nodes"] = found["rendezvous", "min_nodes"] = text
        if self.master_port is not None:
            found["rendezvous", "port"] = f"--master-port {self.master_port}"
        if self.master_addr is not None:
            found["rendezvous", "host"] = f"--master-addr {self.master_addr}"
        if self.endpoint is not None:
            found["rendezvous", "host"] = f"--rdzv-endpoint {self.endpoint}"
            if self.master_port is not None:
                found["rendezvous", "port"] = found["rendezvous", "host"]
        if self.env_nodes is not None:
            found.setdefault(("rendezvous", "nodes"), f"{self.env_nodes[1]} {_FROM_ENV}")


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The policy to run, and whether its rendezvous port was picked here (not written)."""

    policy: Policy
    port_chosen: bool
    extra_args: tuple[str, ...] = ()
    """Arguments for the policy's own script, after its ``[job] args`` (``POLICY -- ARGS``)."""


def parse_nproc(text: str) -> Nproc:
    """``--nproc-per-node``: a number, ``gpu`` or ``cpu``."""
    value = text.strip()
    if value == "gpu":
        return "gpu"
    if value == "cpu":
        return "cpu"
    if value.isascii() and value.isdecimal():
        return int(value)
    raise UsageError(
        f"--nproc-per-node {text!r} is not a number of workers, 'gpu' or 'cpu'",
        "e.g. --nproc-per-node 8, or --nproc-per-node gpu (one worker per visible GPU)",
    )


def parse_nnodes(text: str) -> tuple[int, int]:
    """``--nnodes``: ``N`` or ``MIN:MAX`` -> (min, max)."""
    match = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if match is None:
        raise UsageError(
            f"--nnodes {text!r} is not a number of nodes or a range MIN:MAX",
            "e.g. --nnodes 4 (a fixed-size job), or --nnodes 2:4",
        )
    low = int(match.group(1))
    return low, int(match.group(2) or low)


def parse_endpoint(text: str) -> tuple[str, int | None]:
    """torchrun's ``--rdzv-endpoint``: ``HOST``, ``HOST:PORT``, ``[IPv6]:PORT`` or a bare IPv6
    address -> (host, port or None)."""
    value = text.strip()
    match = re.fullmatch(
        r"\[([0-9A-Fa-f:.%]+)\](?::(\d+))?|([^:\[\]\s]+)(?::(\d+))?|([0-9A-Fa-f:.%]*:[0-9A-Fa-f:.%]*)", value
    )
    if match is None or not (match.group(1) or match.group(3) or match.group(5)):
        raise UsageError(
            f"--rdzv-endpoint {text!r} is not HOST or HOST:PORT",
            "e.g. --rdzv-endpoint 10.0.0.1:29500 (node 0's address and the store's port)",
        )
    host = match.group(1) or match.group(3) or match.group(5)
    port = match.group(2) or match.group(4)
    if port is not None and not 1 <= int(port) <= 65535:
        raise UsageError(
            f"--rdzv-endpoint {text!r}: port {port} is not in 1-65535", "e.g. --rdzv-endpoint host:29500"
        )
    return host, int(port) if port is not None else None


def is_script(target: str) -> bool:
    """Whether ``nvtrain run TARGET`` names a training script rather than a policy: a name
    ending in ``.py``, or a file whose first line is a Python shebang (``#!...python...``)."""
    if target.endswith(".py"):
        return True
    if target.endswith(".toml"):
        return False
    try:  # a regular file only, opened without blocking: a FIFO's open waits for a writer
        if not stat.S_ISREG(os.stat(target).st_mode):
            return False
        with os.fdopen(os.open(target, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            first = file.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def job_name_for(entry: str) -> str:
    """The job name of ``nvtrain run ENTRY``: the script's or module's last name as a DNS label
    (``Train_GPT.py`` -> ``train-gpt``), starting with a letter, at most 40 characters."""
    stem = Path(entry).stem if entry.endswith(".py") else entry.rpartition(".")[2] or entry
    label = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")
    if not label[:1].isalpha():
        label = f"job-{label}".rstrip("-")
    return label[:40].rstrip("-")


def script_checkpoint_dir() -> str:
    """``[checkpoint] dir`` of ``nvtrain run train.py``: ``$TMPDIR/nvtrain`` (the events log
    and the checkpoints of run ``<id>`` go to ``$TMPDIR/nvtrain/<id>/``); when another user has
    made ``$TMPDIR/nvtrain`` first, a fresh folder of this user's beside it, said in one line on
    stderr (``private.claim_default``)."""
    return str(_claimed(Path(tempfile.gettempdir()).resolve() / "nvtrain"))


def _claimed(top: Path, rest: str = "") -> Path:
    chosen, note = private.claim_default(top, rest)
    if note is not None:
        sys.stderr.write(f"nvtrain: note: {note}\n")
    return chosen


def _demo_dir(policy: Policy, source: str) -> Policy:
    """The demo's policy with a fresh folder of this user's for its checkpoints when another
    user has made ``/tmp/nvtrain-demo`` first (``_claimed``); any other policy as it is."""
    if source != DEMO_POLICY_SOURCE or policy.checkpoint.dir != DEMO_CHECKPOINT_DIR:
        return policy
    wanted = Path(DEMO_CHECKPOINT_DIR)
    chosen = _claimed(wanted.parent, wanted.name)
    if chosen == wanted:
        return policy
    checkpoint = policy.checkpoint.model_copy(update={"dir": str(chosen)})
    return policy.model_copy(update={"checkpoint": checkpoint})


def resolve_run(
    *,
    target: str | None = None,
    args: tuple[str, ...] = (),
    policy_file: Path | None = None,
    module: str | None = None,
    nproc_per_node: str | None = None,
    nnodes: str | None = None,
    max_restarts: int | None = None,
    standalone: bool = False,
    master_port: int | None = None,
    no_warm_start: bool = False,
    master_addr: str | None = None,
    rdzv_endpoint: str | None = None,
    rdzv_backend: str | None = None,
    slurm: SlurmStep | None = None,
    on_pod: bool = True,
    cwd: Path | None = None,
) -> Resolved:
    """What ``nvtrain run [TARGET] [ARGS]`` runs: TARGET is a policy file, or a training script
    (``is_script``, or any name after ``--policy FILE``); ``module`` is ``-m MODULE``; with a
    script or module, ARGS are its arguments; with a policy, more arguments after its own.
    The flags are the command line's, as typed (``nproc_per_node="gpu"``, ``nnodes="2:4"``).
    ``slurm``: the Slurm step this runs in (its node count and workers per node stand in for
    keys nothing sets); ``on_pod``: in a Kubernetes pod (else a policy without ``[checkpoint]
    dir`` keeps its checkpoints under ``$TMPDIR``); ``cwd``: where relative paths start."""
    here = cwd or Path.cwd()
    if rdzv_backend is not None and rdzv_backend.strip() not in RDZV_BACKENDS:
        raise UsageError(
            f"--rdzv-backend {rdzv_backend}: nvtrain's rendezvous is NVRx's c10d store on node 0 "
            "(its fault tolerance is built on it); etcd is not supported",
            "drop --rdzv-backend, and give node 0's address with --rdzv-endpoint HOST:PORT",
        )
    script = None
    if module is None and target is not None and (policy_file is not None or is_script(target)):
        script, target = target, None
    if target is not None and module is not None:
        raise UsageError(
            f"-m {module} after the policy {target}: a policy runs its own [job] script or module",
            f"name the policy with --policy to run the module with its settings: nvtrain run "
            f"--policy {target} -m {module} ARGS",
        )
    path = policy_file if policy_file is not None else (Path(target) if target is not None else None)
    entry = script is not None or module is not None
    endpoint_port = None
    if rdzv_endpoint is not None:
        host, endpoint_port = parse_endpoint(rdzv_endpoint)
        if master_addr is not None and master_addr != host:
            raise UsageError(
                f"--master-addr {master_addr} and --rdzv-endpoint {rdzv_endpoint} name two hosts",
                "give one of them: both name the rendezvous store's host (node 0)",
            )
        master_addr = host
    if endpoint_port is not None and master_port is not None and master_port != endpoint_port:
        raise UsageError(
            f"--master-port {master_port} and --rdzv-endpoint {rdzv_endpoint} name two ports",
            "give the port once: --rdzv-endpoint HOST:PORT, or --master-addr HOST --master-port PORT",
        )
    overrides = Overrides(
        nproc_per_node=parse_nproc(nproc_per_node) if nproc_per_node is not None else None,
        nnodes=parse_nnodes(nnodes) if nnodes is not None else None,
        max_restarts=max_restarts,
        standalone=standalone,
        master_port=master_port if master_port is not None else endpoint_port,
        no_warm_start=no_warm_start,
        script=script,
        module=module,
        script_args=args if entry else (),
        master_addr=master_addr.strip() if master_addr is not None else None,
        endpoint=rdzv_endpoint if rdzv_endpoint is not None and endpoint_port is not None else None,
        env_nodes=(slurm.nodes, f"the Slurm step's {slurm.nodes} node(s)")
        if slurm is not None and not slurm.batch  # the batch script is one process, on one node
        else None,
        env_nproc=(slurm.nproc, f"Slurm's {slurm.nproc} worker(s) per node")
        if slurm is not None and slurm.nproc
        else None,
    )
    if rdzv_endpoint is not None and endpoint_port is None:
        overrides = dataclasses.replace(overrides, endpoint=rdzv_endpoint)
    base = _load(path, entry=entry, cwd=here) if path is not None or not entry else None
    source = str(path) if path is not None else ("the command line" if entry else DEMO_POLICY_SOURCE)
    resolved = resolve(base, overrides, source=source, on_pod=on_pod)
    if slurm is not None:  # the job's size must be the step's (launcher.slurm)
        flag = "--standalone" if standalone else None if nnodes is None else f"--nnodes {nnodes}"
        check_job_size(slurm, resolved.policy, flag=flag, policy_file=path)
    resolved = dataclasses.replace(resolved, policy=_absolute_script(resolved.policy, here))
    return resolved if entry else dataclasses.replace(resolved, extra_args=args)


RDZV_BACKENDS = ("c10d", "static")
"""torchrun's ``--rdzv-backend`` values taken: either way node 0 hosts NVRx's c10d store."""

_FROM_ENV = "(srun's environment)"
"""How a finding names a key that Slurm's variables set."""

_FORGIVEN = {"job-entrypoint"}
"""Errors of a policy file that ``nvtrain run`` mends (``_load``)."""


def _load(path: Path | None, *, entry: bool, cwd: Path) -> Policy | dict[str, Any]:
    """The policy file at ``path`` (None: the demo's), validated with a relative ``[checkpoint]
    dir`` resolved against ``cwd`` (``config.paths.resolve_relative``); or, where its only
    errors are what the command line mends, its written keys mended: no ``[job]
    script``/``module`` when the command line names the script (``--policy FILE train.py``).
    ``ConfigError`` with every finding otherwise."""
    result = resolve_relative(validate_file(path), cwd)
    if result.ok:
        assert result.policy is not None
        return result.policy
    data = result.data
    if not (entry and data and all(f.code in _FORGIVEN for f in result.errors)):
        raise ConfigError(result.source, result.findings)
    mended: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    if isinstance(mended.get("job"), dict):
        for key in ("script", "module"):
            mended["job"].pop(key, None)
    return mended


def _absolute_script(policy: Policy, cwd: Path) -> Policy:
    """``policy`` with ``[job] script`` resolved against ``cwd`` (the script's ``__file__`` is
    then absolute, as under ``python SCRIPT``)."""
    script = policy.job.script
    if script is None or Path(script).is_absolute():
        return policy
    job = policy.job.model_copy(update={"script": resolve_path(script, cwd)})
    return policy.model_copy(update={"job": job})


def resolve(
    policy: Policy | dict[str, Any] | None, overrides: Overrides, *, source: str, on_pod: bool = True
) -> Resolved:
    """The policy to run: ``policy`` (None: the default policy of the script form, which needs
    ``overrides.script`` or ``module``; a dict: a file's written keys that ``_load`` mended)
    with the overrides applied and checked again, and a free rendezvous port for a one-node job
    that does not set one. Off a pod (``on_pod`` false), a policy that does not set
    ``[checkpoint] dir`` gets ``script_checkpoint_dir()``. Raises ``ConfigError`` naming the
    flags, or ``UsageError`` when the script does not exist."""
    entry = overrides.module if overrides.module is not None else overrides.script
    if overrides.standalone and overrides.nnodes not in (None, (1, 1)):
        raise UsageError(
            "--standalone runs a one-node job, and --nnodes asks for more nodes",
            "drop --standalone for a multi-node job, or --nnodes for a one-node job",
        )
    if overrides.script is not None and not Path(overrides.script).is_file():
        raise UsageError(
            f"training script {overrides.script!r} not found (relative to {Path.cwd()})",
            "check the path; a policy file's name ends in .toml",
        )
    if policy is None:
        assert entry is not None, "the script form names a script or a module"
        data: dict[str, Any] = {
            "job": {"name": job_name_for(entry)},
            "checkpoint": {"dir": script_checkpoint_dir()},
        }
    else:
        data = _written(policy) if isinstance(policy, Policy) else policy
    written_dir = "dir" in (data.get("checkpoint") or {})
    overrides = _unwritten_only(data, overrides)
    if isinstance(policy, Policy) and overrides == Overrides() and (on_pod or written_dir):
        return _with_port(_demo_dir(policy, source))
    if not on_pod and not written_dir:
        data.setdefault("checkpoint", {})["dir"] = script_checkpoint_dir()
    _apply(data, overrides)
    return _with_port(_demo_dir(_checked(data, overrides, source), source))


def _unwritten_only(data: dict[str, Any], o: Overrides) -> Overrides:
    """``o`` without Slurm's stand-ins for keys that the file or a flag sets."""
    rendezvous = data.get("rendezvous") or {}
    job = data.get("job") or {}
    nodes_set = o.standalone or o.nnodes is not None or "nodes" in rendezvous or "min_nodes" in rendezvous
    nproc_set = o.nproc_per_node is not None or "nproc_per_node" in job
    return dataclasses.replace(
        o,
        env_nodes=None if nodes_set else o.env_nodes,
        env_nproc=None if nproc_set else o.env_nproc,
    )


def check_gpu_workers(policy: Policy, has_gpu: bool, flag: str | None) -> None:
    """``nproc_per_node = "gpu"`` (``--nproc-per-node gpu``) on a node without a GPU is a usage
    error before anything starts: ft_launcher would fail seconds later with exit 1."""
    if policy.job.nproc_per_node != "gpu" or has_gpu:
        return
    where = flag or '[job] nproc_per_node = "gpu"'
    raise UsageError(
        f"{where} starts one worker per GPU, and this node has none (no /dev/nvidia0)",
        "give a number of workers (--nproc-per-node 2) or 'cpu' (one per CPU), or run on a GPU node",
    )


def on_this_node(policy: Policy, has_gpu: bool) -> Policy:
    """``policy`` as this node's workers run it: with ``[job] backend = "auto"`` on a node
    without a GPU the workers use gloo, so a ``collective_timeout`` the policy leaves to its
    default follows the gloo rule (``derive_defaults(backend="gloo")``), which ``nvtrain
    validate`` cannot apply before the node is known. Every other key stays as resolved; a
    written ``collective_timeout`` is kept (validate warns when it breaks the gloo rule)."""
    if policy.job.backend != "auto" or has_gpu:
        return policy
    data, _ = derive_defaults(_written(policy), backend="gloo")
    value = data.get("job", {}).get("collective_timeout")
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or value == policy.job.collective_timeout
    ):
        return policy
    return policy.model_copy(
        update={"job": policy.job.model_copy(update={"collective_timeout": float(value)})}
    )


def _written(policy: Policy) -> dict[str, Any]:
    """The keys the file wrote, as TOML data: without the defaults, and without the keys
    derived from the written ones, which follow the overridden keys when validated again."""
    data: dict[str, Any] = policy.model_dump(by_alias=True, exclude_unset=True)
    for dotted in policy.derived:
        *tables, key = dotted.split(".")
        node: Any = data
        for table in tables:
            node = node.get(table, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(key, None)
    return data


def _apply(data: dict[str, Any], o: Overrides) -> None:
    job = data.setdefault("job", {})
    rendezvous = data.setdefault("rendezvous", {})
    if o.script is not None or o.module is not None:
        job.pop("script", None)
        job.pop("module", None)
        job["module" if o.module is not None else "script"] = o.module or o.script
        job["args"] = list(o.script_args)
    if o.nproc_per_node is not None:
        job["nproc_per_node"] = o.nproc_per_node
    if o.no_warm_start:
        job["warm_start"] = False
    if o.standalone:
        rendezvous["nodes"] = 1
        rendezvous.pop("min_nodes", None)
        rendezvous.pop("port", None)  # unset: a free port is chosen (``_with_port``)
    if o.nnodes is not None:
        low, high = o.nnodes
        rendezvous["nodes"] = high
        if low == high:
            rendezvous.pop("min_nodes", None)
        else:
            rendezvous["min_nodes"] = low
    if o.master_port is not None:
        rendezvous["port"] = o.master_port
    if o.master_addr is not None:
        rendezvous["host"] = o.master_addr
    if o.env_nodes is not None:
        rendezvous["nodes"] = o.env_nodes[0]
    if o.env_nproc is not None:
        job["nproc_per_node"] = o.env_nproc[0]
    if o.max_restarts is not None:
        data.setdefault("restart", {}).setdefault("in_job", {})["max_restarts"] = o.max_restarts


def _checked(data: dict[str, Any], overrides: Overrides, source: str) -> Policy:
    """``data`` validated as the file was: types, then the cross-field checks for the installed
    NVRx. Errors name the flag that set the key, or every flag given when the key is not one."""
    parsed = validate_data(data, source, Policy, {})
    findings = list(parsed.findings)
    if parsed.model is not None:
        findings += check(parsed.model, nvrx=installed_nvrx())
    errors = [f for f in findings if f.severity == "error"]
    if not errors:
        assert parsed.model is not None
        return parsed.model
    flags = overrides.flags()
    given = ", ".join(dict.fromkeys(flags.values()))
    raise ConfigError(source, [_blame(f, flags, f"{source} with {given}") for f in errors])


def _blame(finding: Finding, flags: dict[tuple[str, str], str], otherwise: str) -> Finding:
    flag = flags.get((finding.table, finding.key or ""))
    where = otherwise if flag is None else flag if flag.endswith(_FROM_ENV) else f"{flag} (command line)"
    return dataclasses.replace(finding, file=where, line=None, column=None)


def _with_port(policy: Policy) -> Resolved:
    """``policy`` with a free rendezvous port when it is a one-node job whose port was not
    written (in the file or by a flag: the keys validated are those written, and those derived
    from them, which ``Policy.derived`` names)."""
    r = policy.rendezvous
    if r.nodes != 1 or ("port" in r.model_fields_set and "rendezvous.port" not in policy.derived):
        return Resolved(policy, port_chosen=False)
    avoid = {policy.metrics.port} if policy.metrics.enabled else set()
    port = free_port(avoid=avoid)
    chosen = policy.model_copy(update={"rendezvous": r.model_copy(update={"port": port})})
    return Resolved(chosen, port_chosen=True)


_STD = re.compile(r"[0-3]|\d+:[0-3](,\d+:[0-3])*")
"""torchrun's ``--tee``/``--redirects`` value: 0-3 for every local rank, or ``RANK:N,...``."""


def launcher_options(
    *,
    tee: str | None = None,
    redirects: str | None = None,
    log_dir: str | None = None,
    local_ranks_filter: str | None = None,
) -> tuple[str, ...]:
    """ft_launcher's options for torchrun's log flags (ft_launcher takes torchrun's), checked
    here so that a bad value is exit 2 naming the flag rather than a failed launch."""
    options: list[str] = []
    for flag, value in (("--tee", tee), ("--redirects", redirects)):
        if value is None:
            continue
        if not _STD.fullmatch(value.strip()):
            raise UsageError(
                f"{flag} {value!r}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both) for "
                "every local rank, or LOCAL_RANK:N pairs",
                f"e.g. {flag} 3, or {flag} 0:3,1:2",
            )
        options.append(f"{flag}={value.strip()}")
    if log_dir is not None:
        if not log_dir.strip():
            raise UsageError("--log-dir is empty", "give a folder, e.g. --log-dir /var/log/train")
        options.append(f"--log-dir={Path(log_dir).expanduser().absolute()}")
    if local_ranks_filter is not None:
        if not re.fullmatch(r"\d+(,\d+)*", local_ranks_filter.strip()):
            raise UsageError(
                f"--local-ranks-filter {local_ranks_filter!r} is not a list of local ranks",
                "e.g. --local-ranks-filter 0 (only local rank 0 on the console), or 0,1",
            )
        options.append(f"--local-ranks-filter={local_ranks_filter.strip()}")
    return tuple(options)

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
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any, Literal

from nvtrain.config.checks import check
from nvtrain.config.demo import DEMO_POLICY_SOURCE
from nvtrain.config.derive import derive_defaults
from nvtrain.config.load import validate_data
from nvtrain.config.schema import Policy
from nvtrain.config.validation import load_policy
from nvtrain.errors import ConfigError, UsageError
from nvtrain.findings import Finding
from nvtrain.launcher.ports import free_port
from nvtrain.nvrx import installed_nvrx

__all__ = [
    "on_this_node",
    "Overrides",
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

    def flags(self) -> dict[tuple[str, str], str]:
        """``{(table, key): flag as typed}`` for every key these overrides set."""
        found: dict[tuple[str, str], str] = {}
        if self.nproc_per_node is not None:
            found["job", "nproc_per_node"] = f"--nproc-per-node {self.nproc_per_node}"
        if self.standalone:
            for key in ("nodes", "min_nodes", "port"):
                found["rendezvous", key] = "--standalone"
        if self.nnodes is not None:
            low, high = self.nnodes
            text = f"--nnodes {high}" if low == high else f"--nnodes {low}:{high}"
            found["rendezvous", "nodes"] = found["rendezvous", "min_nodes"] = text
        if self.master_port is not None:
            found["rendezvous", "port"] = f"--master-port {self.master_port}"
        if self.max_restarts is not None:
            found["restart.in_job", "max_restarts"] = f"--max-restarts {self.max_restarts}"
        if self.no_warm_start:
            found["job", "warm_start"] = "--no-warm-start"
        entry = f"-m {self.module}" if self.module is not None else self.script
        if entry is not None:
            for key in ("script", "module", "args"):
                found["job", key] = entry
        return found


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
    and the checkpoints of run ``<id>`` go to ``$TMPDIR/nvtrain/<id>/``)."""
    return str(Path(tempfile.gettempdir()).resolve() / "nvtrain")


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
) -> Resolved:
    """What ``nvtrain run [TARGET] [ARGS]`` runs: TARGET is a policy file, or a training script
    (``is_script``, or any name after ``--policy FILE``); ``module`` is ``-m MODULE``; with a
    script or module, ARGS are its arguments; with a policy, more arguments after its own.
    The flags are the command line's, as typed (``nproc_per_node="gpu"``, ``nnodes="2:4"``)."""
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
    overrides = Overrides(
        nproc_per_node=parse_nproc(nproc_per_node) if nproc_per_node is not None else None,
        nnodes=parse_nnodes(nnodes) if nnodes is not None else None,
        max_restarts=max_restarts,
        standalone=standalone,
        master_port=master_port,
        no_warm_start=no_warm_start,
        script=script,
        module=module,
        script_args=args if entry else (),
    )
    base = load_policy(path) if path is not None or not entry else None
    source = str(path) if path is not None else ("the command line" if entry else DEMO_POLICY_SOURCE)
    resolved = resolve(base, overrides, source=source)
    return resolved if entry else dataclasses.replace(resolved, extra_args=args)


def resolve(policy: Policy | None, overrides: Overrides, *, source: str) -> Resolved:
    """The policy to run: ``policy`` (None: the default policy of the script form, which needs
    ``overrides.script`` or ``module``) with the overrides applied and checked again, and a free
    rendezvous port for a one-node job that does not set one. Raises ``ConfigError`` naming the
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
    elif overrides == Overrides():
        return _with_port(policy)
    else:
        data = _written(policy)
    _apply(data, overrides)
    return _with_port(_checked(data, overrides, source))


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
    where = f"{flag} (command line)" if flag is not None else otherwise
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

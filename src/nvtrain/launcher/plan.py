"""The launch plan: ft_launcher's argv and environment, built from the policy by one pure function.

``nvtrain run --dry-run`` prints it. Version differences live here and in ``nvtrain.nvrx`` (the boundary):
NVRx 0.4 takes ``--ft-restart-policy`` and watches NICs unless told not to; 0.6+ has no restart
policy option, checks NIC link state and reclaims GPU memory before a restart unless told not to.

The ``[heartbeat]`` table is NVRx's fault-tolerance config. ft_launcher gets it as a YAML file
(``--ft-cfg-path``, written by ``rundir.write_state`` from :func:`ft_config`) so that an unset
timeout reaches NVRx as None (no fixed timeout): NVRx 0.4's own defaults are 3600 s and 2700 s,
and its ``--ft-*-timeout`` options take numbers only. Values the policy sets are passed on the
command line as well (the command line wins over the file), so ``--dry-run`` shows them.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.machinery
import json
import math
import shlex
import sys
from pathlib import Path

from nvtrain.config.schema import Heartbeat, Job, Policy
from nvtrain.entry import USER_TMPDIR_ENV
from nvtrain.launcher.dns import store_name
from nvtrain.launcher.identity import Identity
from nvtrain.nvrx import NvrxVersion
from nvtrain.nvrx.ftmain import ENTRY_MODULES
from nvtrain.nvrx.names import LAUNCHER as LAUNCHER_MODULE
from nvtrain.nvrx.storeguard import ALLOW_ENV as STORE_ALLOW_ENV
from nvtrain.private import RUN_KEY_ENV

__all__ = [
    "FT_CONFIG_NAME",
    "LAUNCHER_MODULE",
    "LaunchPlan",
    "build_plan",
    "ft_config",
    "ft_config_text",
    "rendezvous_id",
    "uses_worker_library",
]

FT_CONFIG_NAME = "ft_config.yaml"
"""NVRx's fault-tolerance config in the run's state folder (``--ft-cfg-path``)."""

FTMAIN = "nvtrain.nvrx.ftmain"
"""Runs ft_launcher (``LAUNCHER_MODULE``, its next word) with its fixed waits shortened."""
MONITOR_INTERVAL = 0.1
"""ft_launcher's ``--monitor-interval``, torchrun's default: how often it looks at its workers
(a worker's exit also wakes it at once, ``ftmain``) and at the store for peers' restarts. The
heartbeat checks run at ``[heartbeat] monitor_interval`` (``--ft-workload-check-interval``)."""
GPU_MEMORY_POLL_INTERVAL = 0.05
"""NVRx 0.6+: how often ft_launcher looks at the GPUs' used memory after stopping the workers,
before it lets new ones start (``--ft-gpu-memory-poll-interval``; NVRx's own is 2 s). A look
that finds a dead worker's memory not yet freed used to cost 2 s; now 50 ms more at most."""
ENTRY, ZYGOTE_CLIENT = ENTRY_MODULES
"""The entrypoints: ``ftmain`` cuts ft_launcher's command line after them and their target, so
that no word of the script's arguments reaches ft_launcher's parser (each of ft_launcher's own
options is therefore written as one word, ``--name=value``)."""
ZYGOTE_SERVER = "nvtrain.zygote.server"
PYNVML_WARNING = "ignore:The pynvml package is deprecated:FutureWarning:torch.cuda"
"""torch's ``import pynvml`` (``torch.cuda``, at ``import torch``) warns once per process where
the deprecated ``pynvml`` package is installed (NVRx 0.4 requires it): ignored by message start,
category and the importing module, in every process of the run (``PYTHONWARNINGS`` applies
before the first import)."""
QUIET_ENV = {"PYTHONWARNINGS": PYNVML_WARNING}
"""Environment defaults of every plan: a healthy run prints no warning that needs no action
(docs/run.md, "What a healthy run prints")."""


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start ft_launcher on this node; printed by ``--dry-run``."""

    argv: list[str]
    env: dict[str, str]
    endpoint: str
    is_host: bool
    wait_for: str | None
    """DNS name that must resolve before the launch (the store's host: pod 0 or the control pod);
    None when standalone."""
    stop_timeout: float
    """Seconds between forwarding SIGTERM and killing what is left."""
    env_defaults: dict[str, str] = dataclasses.field(default_factory=dict)
    """Environment for the workers unless the pod's environment sets it already."""
    zygote: list[str] | None = None
    """The warm-start server's argv (``[job] warm_start``), started before ft_launcher."""

    def shell(self) -> str:
        """The plan as one shell command line (environment first)."""
        merged = {**self.env_defaults, **self.env}
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(merged.items()))
        return f"{env} {shlex.join(self.argv)}".strip()

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def rendezvous_id(policy: Policy) -> str:
    """The rendezvous id when the store lives in the control pod: the job's name (the run id,
    the Job's uid, is not known to the control pod; the store lives as long as that pod)."""
    return policy.job.name


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _timeout(value: float | str | None) -> float | None:
    """A policy timeout as NVRx takes it: seconds, or None for unset and ``"auto"``."""
    return None if value is None or isinstance(value, str) else float(value)


def ft_config(heartbeat: Heartbeat) -> dict[str, object]:
    """NVRx's ``fault_tolerance`` config from ``[heartbeat]``: None where the policy sets no
    fixed timeout (unset, or ``"auto"``: NVRx computes it when the workers ask)."""
    return {
        "workload_check_interval": heartbeat.monitor_interval,
        "initial_rank_heartbeat_timeout": _timeout(heartbeat.initial_timeout),
        "rank_heartbeat_timeout": _timeout(heartbeat.timeout),
        "rank_section_timeouts": {name: _timeout(value) for name, value in heartbeat.sections.items()},
        "rank_out_of_section_timeout": _timeout(heartbeat.out_of_section_timeout),
    }


def ft_config_text(heartbeat: Heartbeat) -> str:
    """The ``--ft-cfg-path`` file: JSON, which is YAML too (PyYAML reads ``null`` as None)."""
    return json.dumps({"fault_tolerance": ft_config(heartbeat)}, indent=2) + "\n"


def _ft_options(heartbeat: Heartbeat) -> list[str]:
    """The timeouts the policy fixes, as ft_launcher options (they win over the file)."""
    config = ft_config(heartbeat)
    options = [f"--ft-workload-check-interval={_seconds(heartbeat.monitor_interval)}"]
    for key, option in (
        ("initial_rank_heartbeat_timeout", "--ft-initial-rank-heartbeat-timeout"),
        ("rank_heartbeat_timeout", "--ft-rank-heartbeat-timeout"),
        ("rank_out_of_section_timeout", "--ft-rank-out-of-section-timeout"),
    ):
        value = config[key]
        if isinstance(value, float):
            options.append(f"{option}={_seconds(value)}")
    sections = config["rank_section_timeouts"]
    assert isinstance(sections, dict)
    # The option's syntax is name:seconds,...; a name with either separator stays in the file.
    fixed = any(value is not None for value in sections.values())
    if fixed and not any("," in name or ":" in name for name in sections):
        pairs = [f"{name}:{'none' if t is None else _seconds(t)}" for name, t in sections.items()]
        options.append(f"--ft-rank-section-timeouts={','.join(pairs)}")
    return options


def uses_worker_library(job: Job, cwd: Path | None = None) -> bool:
    """Whether the job's entrypoint imports nvtrain's worker library (``nvtrain`` or
    ``nvtrain.*``), judged from source without running anything: the script file (relative to
    ``cwd``), or for a module its file and its packages' ``__init__.py``, found as ``python -m``
    would (``cwd`` first on the path) but without importing them. Imports made by other modules
    of the job are not followed. A source that cannot be found, read or parsed counts as yes.
    Reads files; ``build_plan`` takes the answer."""
    base = cwd or Path.cwd()
    try:
        if job.module is not None:
            files = _module_files(job.module, base)
        else:
            script = Path(str(job.script))
            files = [script if script.is_absolute() else base / script]
        return any(_imports_nvtrain(path) for path in files)
    except (ImportError, OSError, SyntaxError, ValueError):
        return True


def _module_files(module: str, cwd: Path) -> list[Path]:
    """The files ``python -m module`` runs: each package's ``__init__.py``, then the module (a
    package's ``__main__.py``). ImportError where one is not a Python source file."""
    search: list[str] | None = [str(cwd), *sys.path]
    files, name = [], ""
    for part in [*module.split("."), None]:
        if part is None:  # `-m package` runs the package's __main__
            if search is None or not name:
                break
            part = "__main__"
        name = f"{name}.{part}" if name else part
        spec = importlib.machinery.PathFinder.find_spec(name, search)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            raise ImportError(f"no Python source for {name}")
        files.append(Path(spec.origin))
        search = list(spec.submodule_search_locations or []) or None
        if part == "__main__":
            break
    return files


def _imports_nvtrain(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name == "nvtrain" or name.startswith("nvtrain.") for name in names):
            return True
    return False


def build_plan(
    policy: Policy,
    identity: Identity,
    nvrx: NvrxVersion,
    *,
    python: str,
    policy_path: str,
    events_path: str,
    extra_args: tuple[str, ...] = (),
    launcher_options: tuple[str, ...] = (),
    host_copy_path: str | None = None,
    zygote_path: str | None = None,
    ft_config_path: str | None = None,
    worker_library: bool = True,
    run_key_path: str | None = None,
    launcher_tmp: str | None = None,
    user_tmpdir: str = "",
) -> LaunchPlan:
    """ft_launcher's command line and extra environment for this node.

    ``launcher_options`` are more ft_launcher options (torchrun's ``--tee``, ``--log-dir``, ...),
    placed after nvtrain's own and before the entrypoint. ``ft_config_path`` is where
    ``rundir.write_state`` writes :func:`ft_config_text`. ``worker_library``: whether the
    entrypoint uses nvtrain's worker library (:func:`uses_worker_library`), without which the
    in-process layer cannot act and needs nothing from the environment. ``run_key_path``: the
    run's secret, which the workers find through ``$NVTRAIN_RUN_KEY_FILE``. ``launcher_tmp``:
    the private ``$TMPDIR`` of ft_launcher and the warm-start server (NVRx's IPC sockets, torch
    elastic's logs); the workers inherit it, and ``nvtrain.entry`` gives the script
    ``user_tmpdir`` instead (``$TMPDIR`` of ``nvtrain run``; empty: it was unset)."""
    r, job = policy.rendezvous, policy.job
    host, wait_for = _store_host(policy, identity)
    control = r.store == "control" and not identity.standalone
    # With a control pod no training pod hosts the store, and the rendezvous is named after the
    # job: the control pod belongs to another Kubernetes Job and cannot read this one's uid.
    is_host = identity.node_rank == 0 and not control
    rdzv_id = rendezvous_id(policy) if control else identity.run_id
    endpoint = f"[{host}]:{r.port}" if ":" in host else f"{host}:{r.port}"  # IPv6 in brackets
    rdzv_conf = [f"is_host={int(is_host)}", f"join_timeout={math.ceil(r.join_timeout)}"]
    if nvrx.barrier_rendezvous:
        rdzv_conf.append(f"store_connect_wait_seconds={math.ceil(r.join_timeout)}")
    argv = [
        python,
        "-m",
        FTMAIN,
        LAUNCHER_MODULE,
        f"--nnodes={policy.min_nodes}:{r.nodes}",
        f"--nproc-per-node={job.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf={','.join(rdzv_conf)}",
        f"--max-restarts={policy.restart.in_job.max_restarts}",
        f"--monitor-interval={_seconds(MONITOR_INTERVAL)}",
        f"--term-timeout={_seconds(job.stop_timeout)}",
        f"--workers-stop-timeout={_seconds(min(job.stop_timeout, 15.0))}",
    ]
    if identity.address:
        argv.append(f"--local-addr={identity.address}")
    if ft_config_path:
        argv.append(f"--ft-cfg-path={ft_config_path}")
    argv += _ft_options(policy.heartbeat)
    argv += _health_options(policy, identity, nvrx)
    argv += launcher_options
    entrypoint, zygote = _entrypoint(job, python, zygote_path, worker_library)
    argv += [*entrypoint, *job.args, *extra_args]
    env = {
        "NVTRAIN_POLICY": policy_path,
        "NVTRAIN_RUN_ID": identity.run_id,
        "NVTRAIN_EVENTS": events_path,
        "NVTRAIN_NODE_RANK": str(identity.node_rank),
        "GROUP_RANK": str(identity.node_rank),
    }
    if host_copy_path:  # where the workers keep the staged copy a replaced worker restores from
        env["NVTRAIN_HOST_COPY_DIR"] = host_copy_path
    if zygote is not None and zygote_path:
        env["NVTRAIN_ZYGOTE"] = zygote_path
    if run_key_path:
        env[RUN_KEY_ENV] = run_key_path
    # Who may reach the stores: the rendezvous store (nvtrain.nvrx.storeguard, on its host) and
    # the workers' own, which rank 0 hosts on whichever node it runs (nvtrain.worker.stores).
    if r.store_allow:
        env[STORE_ALLOW_ENV] = " ".join(r.store_allow)
    if launcher_tmp:
        env["TMPDIR"] = launcher_tmp
        env[USER_TMPDIR_ENV] = user_tmpdir
    defaults = _env_defaults(policy, worker_library)
    return LaunchPlan(argv, env, endpoint, is_host, wait_for, job.stop_timeout, defaults, zygote)


def _store_host(policy: Policy, identity: Identity) -> tuple[str, str | None]:
    """(the rendezvous store's host, the name to wait for in DNS: None for a one-node job)."""
    if identity.standalone:
        return "127.0.0.1", None
    if identity.store_host is not None:  # bare metal, Slurm: an address or a host name
        host = identity.store_host.strip("[]")
    else:
        host = store_name(policy, identity.names)
    return host, host


def _health_options(policy: Policy, identity: Identity, nvrx: NvrxVersion) -> list[str]:
    """ft_launcher's restart policy and node health checks, spelled for the installed NVRx: the
    checks of hardware this node does not have are turned off."""
    options: list[str] = []
    if nvrx.supports_min_healthy:
        options.append(f"--ft-restart-policy={policy.restart.in_job.policy}")
        if not identity.has_infiniband:
            options.append("--ft-enable-nic-monitor=false")
    else:
        if not identity.has_infiniband:
            options.append("--ft-enable-nic-healthcheck=false")
        if not identity.has_gpu:
            options.append("--ft-gpu-memory-reclaim-timeout=0")
        else:  # the wait for the stopped workers' GPU memory ends within 50 ms of the reclaim
            options.append(f"--ft-gpu-memory-poll-interval={_seconds(GPU_MEMORY_POLL_INTERVAL)}")
        # NVRx's progress tracker needs an iteration file that nvtrain does not keep; without
        # one it only warns at each restart that it is inactive ("no iterations are being
        # reported"). Off: 0 cycles (0.6.0's default on the command line beats the file's).
        options.append("--ft-max-no-progress-cycles=0")
    return options


def _entrypoint(
    job: Job, python: str, zygote_path: str | None, worker_library: bool
) -> tuple[list[str], list[str] | None]:
    """(what ft_launcher runs for each worker, before the script's arguments; the warm-start
    server's command line, None without warm starts)."""
    target = ["-m", job.module] if job.module is not None else [str(job.script)]
    if not (job.warm_start and zygote_path):  # on by default, plain torchrun scripts included
        # The script runs as ``python SCRIPT`` would, and its process skips the interpreter's
        # finalization at the end, where torch can abort a finished rank (nvtrain.entry).
        return ["-m", ENTRY, *target], None
    # Workers are forked from a warm interpreter (nvtrain.zygote); the client stands in for
    # each one towards ft_launcher.
    zygote = [python, "-m", ZYGOTE_SERVER, "--socket", zygote_path]
    zygote += ["--module", str(job.module)] if job.module is not None else ["--script", str(job.script)]
    if not worker_library:
        zygote.append("--plain")
    return ["-m", ZYGOTE_CLIENT, *target], zygote


def _env_defaults(policy: Policy, worker_library: bool) -> dict[str, str]:
    """Environment defaults for the workers (a variable already set wins): only what the chosen
    layers need, so a plain torchrun script keeps torch's and NCCL's defaults; and in every plan
    the few that keep a healthy run's output to what needs a person (``QUIET_ENV``, torchrun's
    ``OMP_NUM_THREADS``)."""
    defaults: dict[str, str] = dict(QUIET_ENV)
    nproc = policy.job.nproc_per_node
    if isinstance(nproc, int) and nproc > 1:
        # torchrun's own default for several workers a node, which ft_launcher otherwise sets
        # with a five-line banner: given here, the workers get the same value and no banner.
        defaults["OMP_NUM_THREADS"] = "1"
    if policy.restart.in_process.enabled and worker_library:
        # The in-process layer polls its stores every second; c10d logs each poll timeout.
        defaults["TORCH_CPP_LOG_LEVEL"] = "ERROR"
        if policy.job.backend != "gloo":
            # What NVRx's in-process restart needs from NCCL: errors raised, not fatal, and no
            # NVLink SHARP (multicast) communicators, which cannot be aborted.
            defaults.update({"TORCH_NCCL_RETHROW_CUDA_ERRORS": "0", "NCCL_NVLS_ENABLE": "0"})
    return defaults

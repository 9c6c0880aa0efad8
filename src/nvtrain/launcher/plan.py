"""The launch plan: ft_launcher's argv and environment, built from the policy by one pure function.

``nvtrain run --dry-run`` prints it. Version differences live here and in ``nvtrain.nvrx``:
NVRx 0.4 takes ``--ft-restart-policy`` and watches NICs unless told not to; 0.6+ has no restart
policy option, checks NIC link state and reclaims GPU memory before a restart unless told not to.
"""

from __future__ import annotations

import dataclasses
import math
import shlex

from nvtrain.config.schema import Policy
from nvtrain.launcher.dns import store_name
from nvtrain.launcher.identity import Identity
from nvtrain.nvrx import NvrxVersion

__all__ = ["LAUNCHER_MODULE", "LaunchPlan", "build_plan", "rendezvous_id"]

LAUNCHER_MODULE = "nvidia_resiliency_ext.fault_tolerance.launcher"
ZYGOTE_CLIENT = "nvtrain.zygote.client"
ZYGOTE_SERVER = "nvtrain.zygote.server"


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


def build_plan(
    policy: Policy,
    identity: Identity,
    nvrx: NvrxVersion,
    *,
    python: str,
    policy_path: str,
    events_path: str,
    extra_args: tuple[str, ...] = (),
    host_copy_path: str | None = None,
    zygote_path: str | None = None,
) -> LaunchPlan:
    """ft_launcher's command line and extra environment for this node."""
    r, hb, job = policy.rendezvous, policy.heartbeat, policy.job
    if identity.standalone:
        host, wait_for = "127.0.0.1", None
    else:
        host = wait_for = store_name(policy)
    control = r.store == "control" and not identity.standalone
    # With a control pod no training pod hosts the store, and the rendezvous is named after the
    # job: the control pod belongs to another Kubernetes Job and cannot read this one's uid.
    is_host = identity.node_rank == 0 and not control
    rdzv_id = rendezvous_id(policy) if control else identity.run_id
    endpoint = f"{host}:{r.port}"
    rdzv_conf = [f"is_host={int(is_host)}", f"join_timeout={math.ceil(r.join_timeout)}"]
    if nvrx.barrier_rendezvous:
        rdzv_conf.append(f"store_connect_wait_seconds={math.ceil(r.join_timeout)}")
    argv = [
        python,
        "-m",
        LAUNCHER_MODULE,
        f"--nnodes={policy.min_nodes}:{r.nodes}",
        f"--nproc-per-node={job.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf={','.join(rdzv_conf)}",
        f"--max-restarts={policy.restart.in_job.max_restarts}",
        f"--monitor-interval={_seconds(min(hb.monitor_interval, 1.0))}",
        f"--term-timeout={_seconds(job.stop_timeout)}",
        f"--workers-stop-timeout={_seconds(min(job.stop_timeout, 15.0))}",
    ]
    if identity.address:
        argv.append(f"--local-addr={identity.address}")
    argv += [
        f"--ft-initial-rank-heartbeat-timeout={_seconds(hb.initial_timeout)}",
        f"--ft-rank-heartbeat-timeout={_seconds(hb.timeout)}",
        f"--ft-workload-check-interval={_seconds(hb.monitor_interval)}",
    ]
    if nvrx.supports_min_healthy:
        argv.append(f"--ft-restart-policy={policy.restart.in_job.policy}")
        if not identity.has_infiniband:
            argv.append("--ft-enable-nic-monitor=false")
    else:
        if not identity.has_infiniband:
            argv.append("--ft-enable-nic-healthcheck=false")
        if not identity.has_gpu:
            argv.append("--ft-gpu-memory-reclaim-timeout=0")
    target = ["-m", job.module] if job.module is not None else [str(job.script)]
    zygote: list[str] | None = None
    if job.warm_start and zygote_path:
        # Workers are forked from a warm interpreter (nvtrain.zygote); the client stands in
        # for each one towards ft_launcher.
        argv += ["-m", ZYGOTE_CLIENT, *target]
        zygote = [python, "-m", ZYGOTE_SERVER, "--socket", zygote_path]
        zygote += ["--module", str(job.module)] if job.module is not None else ["--script", str(job.script)]
    else:
        argv += target
    argv += [*job.args, *extra_args]
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
    # The in-process layer polls its stores every second; c10d logs each poll timeout.
    defaults = {"TORCH_CPP_LOG_LEVEL": "ERROR"}
    if policy.restart.in_process.enabled and job.backend != "gloo":
        # What NVRx's in-process restart needs from NCCL: errors raised, not fatal, and no
        # NVLink SHARP (multicast) communicators, which cannot be aborted.
        defaults.update({"TORCH_NCCL_RETHROW_CUDA_ERRORS": "0", "NCCL_NVLS_ENABLE": "0"})
    return LaunchPlan(argv, env, endpoint, is_host, wait_for, job.stop_timeout, defaults, zygote)

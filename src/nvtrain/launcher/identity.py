"""Where this launcher stands: node rank, own address, run id. The only reader of the environment.

Precedence, highest first: command-line flags > ``NVTRAIN_*`` variables > what Kubernetes
injects (``JOB_COMPLETION_INDEX``, ``POD_IP``, the hostname) > the policy.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.launcher.dns import pod_name

__all__ = ["Identity", "identify", "new_run_id"]


@dataclasses.dataclass(frozen=True)
class Identity:
    """This node's place in the job."""

    node_rank: int
    """Index of this pod in the job (0 hosts the rendezvous store)."""
    standalone: bool
    """True for a one-node job: localhost, no DNS."""
    address: str | None
    """Address this node publishes to its peers (``--local-addr``): ``POD_IP``, else this pod's
    own stable DNS name; None when standalone (NVRx uses localhost)."""
    hostname: str
    run_id: str
    has_gpu: bool
    has_infiniband: bool


def new_run_id(job_name: str) -> str:
    """A fresh run id: ``<job>-<UTC time>-<random>``, valid as a DNS label prefix."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{job_name}-{stamp}-{secrets.token_hex(3)}"


def _node_rank(env: Mapping[str, str], hostname: str, policy: Policy) -> int | None:
    for var in ("NVTRAIN_NODE_RANK", "JOB_COMPLETION_INDEX"):
        if env.get(var, "").strip():
            text = env[var].strip()
            if not (text.isascii() and text.isdecimal()):
                raise UsageError(
                    f"{var}={text!r} is not a node index",
                    f"set {var} to a number from 0 to {policy.rendezvous.nodes - 1}",
                )
            return int(text)
    match = re.fullmatch(rf"{re.escape(policy.job.name)}-([0-9]+)", hostname.split(".")[0])
    return int(match.group(1)) if match else None


def identify(
    policy: Policy,
    env: Mapping[str, str] | None = None,
    *,
    run_id: str | None = None,
    hostname: str | None = None,
) -> Identity:
    """Work out this node's identity from the environment (``os.environ`` by default)."""
    env = os.environ if env is None else env
    host = hostname or env.get("HOSTNAME") or socket.gethostname()
    nodes = policy.rendezvous.nodes
    rank = _node_rank(env, host, policy)
    standalone = nodes == 1
    if rank is None:
        if not standalone:
            raise UsageError(
                f"cannot tell this pod's node index for a {nodes}-node job",
                "run it as an Indexed Job (JOB_COMPLETION_INDEX), name the pod "
                f"{policy.job.name}-<index>, or set NVTRAIN_NODE_RANK",
            )
        rank = 0
    if rank >= nodes:
        raise UsageError(
            f"node index {rank} is outside the job's {nodes} node(s)",
            f"raise [rendezvous] nodes to at least {rank + 1}, or fix the index",
        )
    rid = run_id or env.get("NVTRAIN_RUN_ID", "").strip()
    if not rid:
        if not standalone:
            raise UsageError(
                "a multi-node job needs a run id that every pod shares",
                "set NVTRAIN_RUN_ID (the manifests use the Job's uid) or pass --run-id",
            )
        rid = new_run_id(policy.job.name)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", rid):
        raise UsageError(
            f"run id {rid!r} is not usable as a directory and rendezvous name",
            "use letters, digits, '.', '_' and '-' (at most 128)",
        )
    address = None
    if not standalone:
        # Without POD_IP, NVRx would publish socket.getfqdn(): in a pod without `subdomain`
        # that is the bare hostname, which the peers cannot resolve. This pod's stable name is
        # resolvable wherever pod 0's name is (the same headless Service), and follows the pod
        # to a new IP when it is replaced.
        address = env.get("POD_IP", "").strip() or pod_name(policy, rank)
    return Identity(
        node_rank=rank,
        standalone=standalone,
        address=address,
        hostname=host,
        run_id=rid,
        has_gpu=Path("/dev/nvidia0").exists()
        or bool(env.get("NVIDIA_VISIBLE_DEVICES", "").replace("void", "").strip()),
        has_infiniband=Path("/sys/class/infiniband").is_dir(),
    )

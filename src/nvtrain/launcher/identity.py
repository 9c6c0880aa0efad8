"""Where this launcher stands: node rank, own address, run id, the peers' DNS names. The only
reader of the environment.

Precedence, highest first: command-line flags > ``NVTRAIN_*`` variables > what Kubernetes
injects (``JOB_COMPLETION_INDEX``, ``POD_IP``, the hostname, the pod's own DNS name in
``/etc/hosts``) > the policy.

The peers' names follow the pod's own names, as JobSet and Kubeflow Trainer do: an Indexed Job's
pod has the hostname ``<job>-<index>``, where ``<job>`` is the Job's real name, and with a
``subdomain`` the kubelet writes its DNS name ``<hostname>.<subdomain>.<namespace>.svc.<cluster
domain>`` into ``/etc/hosts``. So pod 0 is ``<job>-0`` under the same domain, whatever the policy
says, and a Job renamed after ``nvtrain manifest`` (Kustomize ``namePrefix``, ``nameSuffix``,
``namespace``) still finds its peers. Worked examples, for ``[job] name = "llm-train"`` and the
defaults of ``[rendezvous]``:

- hostname ``llm-train-2``, ``/etc/hosts`` with ``10.0.0.7 llm-train-2.llm-train.default.svc.cluster.local
  llm-train-2``: pod 0 is ``llm-train-0.llm-train.default.svc.cluster.local`` (as the policy says);
- hostname ``exp1-llm-train-2``, ``/etc/hosts`` with ``exp1-llm-train-2.exp1-llm-train.team-a.svc.
  cluster.local``: pod 0 is ``exp1-llm-train-0.exp1-llm-train.team-a.svc.cluster.local``;
- hostname ``exp1-llm-train-2`` and no such line (a pod without ``subdomain``, a test outside
  Kubernetes): pod 0 is ``exp1-llm-train-0.llm-train.default.svc.cluster.local`` (the domain from
  the policy);
- hostname ``laptop`` with ``NVTRAIN_NODE_RANK=1``: the hostname says nothing about the job, so
  pod 0 is the policy's ``llm-train-0.llm-train.default.svc.cluster.local``.

A hostname counts as the job's only when it is ``<base>-<index>`` with ``[job] name`` inside
``<base>`` and ``<index>`` the node rank (``nvtrain validate --manifest`` refuses a Job whose
name does not hold the job name), or the control pod's ``<[job] name>-control``; a domain only
when it has the kubelet's shape ``<subdomain>.<namespace>.svc.<cluster domain>``.
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
from nvtrain.launcher.dns import PodNames

__all__ = ["HOSTS_FILE", "Identity", "identify", "new_run_id", "pod_names"]

HOSTS_FILE = Path("/etc/hosts")
"""Where the kubelet writes the pod's own DNS name (with ``hostname`` and ``subdomain`` set)."""

_HOSTS_LIMIT = 1 << 20
"""Bytes of the hosts file read at most (the kubelet's is a few lines)."""


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
    names: PodNames | None = None
    """The DNS names of this job's pods as this pod sees them (``pod_names``); None: the
    policy's (``PodNames.of``)."""


def new_run_id(job_name: str) -> str:
    """A fresh run id: ``<job>-<UTC time>-<random>``, valid as a DNS label prefix."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{job_name}-{stamp}-{secrets.token_hex(3)}"


def _hostname_index(hostname: str, policy: Policy) -> tuple[str, int] | None:
    """(base, index) when the short ``hostname`` is ``<base>-<index>`` with ``[job] name`` in
    ``<base>``: the pod of an Indexed Job (or StatefulSet), perhaps renamed with a prefix or
    suffix (``exp1-llm-train-3`` -> ``("exp1-llm-train", 3)``)."""
    short = hostname.split(".")[0]
    match = re.fullmatch(rf"(.*{re.escape(policy.job.name)}.*)-([0-9]+)", short, re.IGNORECASE)
    return (match.group(1), int(match.group(2))) if match else None


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
    parts = _hostname_index(hostname, policy)
    return parts[1] if parts else None


def _kubelet_domain(name: str, short: str) -> str | None:
    """``<subdomain>.<namespace>.svc.<cluster domain>`` when ``name`` is ``<short>.`` followed by
    a domain of that shape, else None."""
    name = name.lower().rstrip(".")
    if not name.startswith(short + "."):
        return None
    domain = name[len(short) + 1 :]
    labels = domain.split(".")
    if len(labels) < 4 or labels[2] != "svc" or not all(labels):
        return None
    return domain


def _own_domain(hostname: str, hosts_file: Path | None) -> str | None:
    """The domain of this pod's own DNS name: from ``hostname`` when it is the full name, else
    from the hosts file line that the kubelet writes for a pod with a ``subdomain``
    (``<pod IP> <hostname>.<subdomain>.<namespace>.svc.<cluster domain> <hostname>``)."""
    short = hostname.split(".")[0].lower()
    domain = _kubelet_domain(hostname, short)
    if domain is not None or hosts_file is None:
        return domain
    try:
        with hosts_file.open("rb") as f:
            text = f.read(_HOSTS_LIMIT).decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        for name in line.split("#", 1)[0].split()[1:]:
            domain = _kubelet_domain(name, short)
            if domain is not None:
                return domain
    return None


def pod_names(
    policy: Policy,
    env: Mapping[str, str] | None = None,
    *,
    hostname: str | None = None,
    rank: int | None = None,
    hosts_file: Path | None = HOSTS_FILE,
) -> PodNames:
    """The DNS names of this job's pods, as this pod sees them (see the module docstring): the
    base name from this pod's hostname when it is the job's (``<base>-<rank>``, or the control
    pod ``<[job] name>-control``), and the domain from this pod's own DNS name when that has
    the kubelet's shape; whatever is not found, from the policy."""
    env = os.environ if env is None else env
    host = hostname or env.get("HOSTNAME") or socket.gethostname()
    names = PodNames.of(policy)
    parts = _hostname_index(host, policy)
    own = parts is not None and (rank is None or parts[1] == rank)
    if parts is not None and own:
        names = dataclasses.replace(names, base=parts[0])
    elif host.split(".")[0].lower() != names.control_host.lower():
        return names  # not this job's pod: nothing in its names is the job's
    domain = _own_domain(host, hosts_file)
    return names if domain is None else dataclasses.replace(names, domain=domain)


def identify(
    policy: Policy,
    env: Mapping[str, str] | None = None,
    *,
    run_id: str | None = None,
    hostname: str | None = None,
    hosts_file: Path | None = HOSTS_FILE,
) -> Identity:
    """Work out this node's identity from the environment (``os.environ`` by default) and, for
    the peers' names, ``hosts_file`` (None: not read)."""
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
    names = None
    if not standalone:
        names = pod_names(policy, env, hostname=host, rank=rank, hosts_file=hosts_file)
        # Without POD_IP, NVRx would publish socket.getfqdn(): in a pod without `subdomain`
        # that is the bare hostname, which the peers cannot resolve. This pod's stable name is
        # resolvable wherever pod 0's name is (the same headless Service), and follows the pod
        # to a new IP when it is replaced.
        address = env.get("POD_IP", "").strip() or names.pod(rank)
    return Identity(
        node_rank=rank,
        standalone=standalone,
        address=address,
        hostname=host,
        run_id=rid,
        has_gpu=Path("/dev/nvidia0").exists()
        or bool(env.get("NVIDIA_VISIBLE_DEVICES", "").replace("void", "").strip()),
        has_infiniband=Path("/sys/class/infiniband").is_dir(),
        names=names,
    )

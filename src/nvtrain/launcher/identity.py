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

Off Kubernetes the same four things come from elsewhere, and the rest of nvtrain does not know
which source gave them (``Identity.source``):

- **bare metal** (torchrun's flags): the node rank from ``--node-rank`` (or
  ``NVTRAIN_NODE_RANK``), the store's host from ``[rendezvous] host`` (``--master-addr``,
  ``--rdzv-endpoint``), the run id from ``--run-id``/``--rdzv-id`` or ``NVTRAIN_RUN_ID``; the
  address published to the peers is ``--local-addr``, else, when the store's host is an IP
  address, this node's address on the route to it (no DNS needed), else NVRx's default;
- **Slurm** (``srun nvtrain run``, ``launcher.slurm``): ``SLURM_NODEID``, the first node of the
  step's node list, ``SLURMD_NODENAME``, and a run id ``<[job] name>-slurm-<SLURM_JOB_ID>``.

Precedence, highest first: the command line, ``NVTRAIN_*``, Kubernetes' ``JOB_COMPLETION_INDEX``,
Slurm's variables, the hostname. A written ``[rendezvous] host`` wins over Slurm's node list.
The job's size is not overridden that way: ``nvtrain run`` refuses a ``[rendezvous] nodes``
(or ``--nnodes``) that does not fit the step before it gets here (``slurm.check_job_size``),
so a task of a multi-node step is never node 0 of a one-node job of its own.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import secrets
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.kubenames import PodNames, control_hostname, pod_hostname
from nvtrain.launcher import slurm, trainjob

__all__ = [
    "HOSTS_FILE",
    "Identity",
    "Source",
    "identify",
    "new_run_id",
    "on_kubernetes",
    "pod_names",
    "route_address",
    "slurm_step",
]

Source = Literal["standalone", "kubernetes", "slurm", "flags"]

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
    store_host: str | None = None
    """The rendezvous store's host when it is not a pod's DNS name: ``[rendezvous] host``
    (bare metal) or node 0 of the Slurm step. None: Kubernetes names (or standalone)."""
    source: Source = "kubernetes"
    """Where the node rank and the store's host came from."""


def new_run_id(job_name: str) -> str:
    """A fresh run id: ``<job>-<UTC time>-<random>``, valid as a DNS label prefix."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{job_name}-{stamp}-{secrets.token_hex(3)}"


_INDEX_SEPARATOR = pod_hostname("", 0).removesuffix("0")
"""What stands between a pod hostname's base and its index (``kubenames.pod_hostname``)."""


def _hostname_index(hostname: str, policy: Policy) -> tuple[str, int] | None:
    """(base, index) when the short ``hostname`` is ``pod_hostname(base, index)`` with ``[job]
    name`` in ``<base>``: the pod of an Indexed Job (or StatefulSet), perhaps renamed with a
    prefix or suffix (``exp1-llm-train-3`` -> ``("exp1-llm-train", 3)``). The index is read
    as digits, leading zeros allowed."""
    short = hostname.split(".")[0]
    name, sep = re.escape(policy.job.name), re.escape(_INDEX_SEPARATOR)
    match = re.fullmatch(rf"(.*{name}.*){sep}([0-9]+)", short, re.IGNORECASE)
    return (match.group(1), int(match.group(2))) if match else None


def _is_control_host(hostname: str, policy: Policy) -> bool:
    """Whether the short ``hostname`` is the control pod's, ``<[job] name>-control``
    (``kubenames.control_hostname``, with ``CONTROL_SUFFIX``), in any case."""
    return hostname.split(".")[0].lower() == control_hostname(policy.job.name).lower()


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
    the kubelet's shape; whatever is not found, from the policy. A pod of a TrainJob
    (``NVTRAIN_TRAINJOB``) takes the base name from the TrainJob's name (``launcher.trainjob``)."""
    env = os.environ if env is None else env
    host = hostname or env.get("HOSTNAME") or socket.gethostname()
    names = PodNames.of(policy)
    trainjob_name = trainjob.trainjob_name(env)
    if trainjob_name is not None:
        names = trainjob.trainjob_names(policy, trainjob_name)
        domain = _own_domain(host, hosts_file)
        return names if domain is None else dataclasses.replace(names, domain=domain)
    parts = _hostname_index(host, policy)
    own = parts is not None and (rank is None or parts[1] == rank)
    if parts is not None and own:
        names = dataclasses.replace(names, base=parts[0])
    elif not _is_control_host(host, policy):
        return names  # not this job's pod: nothing in its names is the job's
    domain = _own_domain(host, hosts_file)
    return names if domain is None else dataclasses.replace(names, domain=domain)


def on_kubernetes(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs in a Kubernetes pod (the kubelet sets
    ``KUBERNETES_SERVICE_HOST`` in every container) or as an Indexed Job's pod."""
    env = os.environ if env is None else env
    return bool(env.get("KUBERNETES_SERVICE_HOST", "").strip() or env.get("JOB_COMPLETION_INDEX", "").strip())


def slurm_step(env: Mapping[str, str] | None = None) -> slurm.SlurmStep | None:
    """This task's Slurm step (``launcher.slurm``), unless Kubernetes gives the node index
    (``JOB_COMPLETION_INDEX``) or this is no Slurm task."""
    env = os.environ if env is None else env
    if env.get("JOB_COMPLETION_INDEX", "").strip():
        return None
    return slurm.from_env(env)


def route_address(host: str, port: int) -> str | None:
    """This node's address on the route to ``host`` (an IP address): what a peer reaches it
    at on that network, found without DNS and without sending anything (a UDP socket's
    ``connect`` picks the source address). None when ``host`` is not an IP address or there is
    no route to it."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((str(ip), port))
            return str(sock.getsockname()[0])
    except OSError:
        return None


def _rank_hint(policy: Policy, nodes: int) -> str:
    return (
        f"give each node its index from 0 to {nodes - 1}: --node-rank N (bare metal, as torchrun), "
        "srun (Slurm sets SLURM_NODEID), an Indexed Job (JOB_COMPLETION_INDEX), a pod named "
        f"{policy.job.name}-<index>, or NVTRAIN_NODE_RANK"
    )


def identify(
    policy: Policy,
    env: Mapping[str, str] | None = None,
    *,
    run_id: str | None = None,
    hostname: str | None = None,
    hosts_file: Path | None = HOSTS_FILE,
    node_rank: int | None = None,
    local_addr: str | None = None,
) -> Identity:
    """Work out this node's identity from the environment (``os.environ`` by default), the
    command line (``run_id``, ``node_rank``, ``local_addr``: torchrun's ``--rdzv-id``,
    ``--node-rank``, ``--local-addr``) and, for the peers' names on Kubernetes,
    ``hosts_file`` (None: not read)."""
    env = os.environ if env is None else env
    host = hostname or env.get("HOSTNAME") or socket.gethostname()
    standalone = policy.rendezvous.nodes == 1
    step = slurm_step(env)  # its job id names a one-node run too
    _refuse_batch_script(step, policy.rendezvous.nodes)
    here = None if standalone else step  # where this node stands in a multi-node step
    store_host = policy.rendezvous.host or (here.store_host if here is not None else None)
    source: Source = "standalone" if standalone else "kubernetes"
    if not standalone and policy.rendezvous.host:
        source = "flags"
    elif here is not None:
        source = "slurm"
    rank = _rank(policy, env, host, node_rank, here, store_host)
    rid = _run_id(policy, env, run_id, step)
    address = None
    names = None
    if not standalone:
        address = local_addr or env.get("POD_IP", "").strip() or None
        if store_host is None:
            names = pod_names(policy, env, hostname=host, rank=rank, hosts_file=hosts_file)
            # Without POD_IP, NVRx would publish socket.getfqdn(): in a pod without `subdomain`
            # that is the bare hostname, which the peers cannot resolve. This pod's stable name
            # is resolvable wherever pod 0's name is (the same headless Service), and follows
            # the pod to a new IP when it is replaced.
            address = address or names.pod(rank)
        elif address is None and source == "slurm" and here is not None:
            address = here.node_name  # a name of the node list, as the store's host is
        elif address is None:
            address = route_address(store_host, policy.rendezvous.port)
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
        store_host=None if standalone else store_host,
        source=source,
    )


def _refuse_batch_script(step: slurm.SlurmStep | None, nodes: int) -> None:
    """A multi-node job started from a Slurm batch script would wait for nodes that never come."""
    if step is not None and step.batch and nodes > 1:
        raise UsageError(
            f"a {nodes}-node job started in a Slurm batch script (no SLURM_STEP_ID): nvtrain run "
            "runs on this node only, and the other nodes would never join",
            "start it on every node of the allocation: srun --ntasks-per-node=1 nvtrain run ...",
        )


def _rank(
    policy: Policy,
    env: Mapping[str, str],
    host: str,
    node_rank: int | None,
    here: slurm.SlurmStep | None,
    store_host: str | None,
) -> int:
    """This node's index: ``--node-rank``, else ``NVTRAIN_NODE_RANK``, ``JOB_COMPLETION_INDEX``
    or the hostname, else the Slurm step's; 0 for a one-node job. Raises when it is unknown or
    outside the job, or when ``--node-rank`` comes without a way to find node 0."""
    nodes = policy.rendezvous.nodes
    standalone = nodes == 1
    rank = node_rank if node_rank is not None else _node_rank(env, host, policy)
    if rank is None and here is not None:
        rank = here.node_rank
    if node_rank is not None and store_host is None and not standalone and not on_kubernetes(env):
        raise UsageError(
            f"--node-rank {node_rank} of a {nodes}-node job, but no rendezvous host: off Kubernetes "
            "nvtrain cannot find node 0 by a pod's DNS name",
            "give node 0's address as torchrun does: --master-addr HOST (or --rdzv-endpoint "
            "HOST:PORT, or [rendezvous] host in the policy)",
        )
    if rank is None:
        if not standalone:
            where = "pod" if store_host is None and on_kubernetes(env) else "node"
            raise UsageError(
                f"cannot tell the node index of this {where} in a {nodes}-node job", _rank_hint(policy, nodes)
            )
        rank = 0
    if rank >= nodes:
        raise UsageError(
            f"node index {rank} is outside the job's {nodes} node(s)",
            f"raise [rendezvous] nodes (--nnodes) to at least {rank + 1}, or fix the index",
        )
    return rank


def _run_id(policy: Policy, env: Mapping[str, str], run_id: str | None, step: slurm.SlurmStep | None) -> str:
    """``--run-id``/``--rdzv-id``, else ``NVTRAIN_RUN_ID``, else the Slurm job's, else a fresh one
    (one-node jobs only); raises when it is missing or not usable as a name."""
    rid = run_id or env.get("NVTRAIN_RUN_ID", "").strip()
    if not rid and step is not None:
        rid = f"{policy.job.name}-slurm-{step.job_id}"
    if not rid:
        if policy.rendezvous.nodes > 1:
            raise UsageError(
                "a multi-node job needs a run id that every node shares",
                "pass the same --rdzv-id ID (or --run-id) to every node, or set NVTRAIN_RUN_ID "
                "(the Kubernetes manifests use the Job's uid)",
            )
        rid = new_run_id(policy.job.name)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", rid):
        raise UsageError(
            f"run id {rid!r} is not usable as a directory and rendezvous name",
            "use letters, digits, '.', '_' and '-' (at most 128)",
        )
    return rid

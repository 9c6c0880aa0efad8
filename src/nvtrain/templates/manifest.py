"""Kubernetes manifests for a policy: plain dicts built by pure functions, dumped by PyYAML.

``nvtrain manifest`` renders, from one validated policy and a few ``ManifestOptions`` that the
policy does not hold (image, resources, storage), these objects in one multi-document YAML:

- a ConfigMap with the policy file, mounted at ``/etc/nvtrain`` (immutable; its name carries a
  hash of the text, so a changed policy never reaches the pods of a Job already running);
- the headless Service that gives pod *i* its DNS name ``<job>-<i>.<service>.<namespace>...``;
- a NetworkPolicy: the job's pods accept traffic only from pods of the same job;
- on request, a Prometheus Operator PodMonitor (``monitoring``) and a Volcano PodGroup
  (``scheduling``);
- with ``[rendezvous] store = "control"`` (and 2 or more nodes), a Job ``<job>-control`` whose
  one small CPU pod runs ``nvtrain control /etc/nvtrain/policy.toml``: the rendezvous store;
- an Indexed ``batch/v1`` Job whose pods run ``nvtrain run /etc/nvtrain/policy.toml``, or, with
  ``jobset=True``, a ``jobset.x-k8s.io/v1alpha2`` JobSet around the same Job template (and the
  control Job's, as a second replicated Job).

The pods' CPU and memory and their QoS class come from ``qos``, their security contexts from
``podsecurity``, and tolerations, priority, scheduler, queue and pull policy from ``scheduling``.

Every value that the policy holds (names, namespace, nodes, port, stop timeout, checkpoint
directory) is taken from it, so the manifest and the policy cannot disagree. Strings reach the
YAML only as values that PyYAML quotes; nothing is pasted into YAML text. See
``docs/kubernetes.md`` for what each object does and why.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from nvtrain.config.checks import MAX_NPROC
from nvtrain.config.schema import Policy
from nvtrain.errors import ConfigError, ExitCode, UsageError
from nvtrain.launcher.dns import CONTROL_SUFFIX
from nvtrain.templates import alerts, monitoring, podextras, podsecurity, qos, scheduling, trainer_runtime
from nvtrain.templates.names import CONTROL_CHARS as _CONTROL
from nvtrain.templates.names import DNS_SUBDOMAIN as _DNS_SUBDOMAIN
from nvtrain.templates.names import LABEL_VALUE as _LABEL_VALUE
from nvtrain.templates.names import QUALIFIED_NAME as _QUALIFIED
from nvtrain.templates.nvrx_pin import NVRX_ANNOTATION, parse_nvrx_option
from nvtrain.templates.quantity import format_bytes as _quantity
from nvtrain.templates.quantity import parse_quantity as _check_quantity

__all__ = [
    "COMPONENT_LABEL",
    "CONFIGMAP_LIMIT",
    "CONTAINER",
    "CONTROL_CONTAINER",
    "CONTROL_RESOURCES",
    "EFA_RESOURCE",
    "GPU_RESOURCE",
    "GRACE_MARGIN",
    "HOST_COPY_SLOTS",
    "JOBSET_POD_SUFFIX",
    "NEVER_RETRY",
    "OLDEST_KUBERNETES",
    "PEER_COPY_SLOTS",
    "PER_INDEX_SINCE",
    "POLICY_FILE",
    "POLICY_MOUNT",
    "ManifestOptions",
    "Rendered",
    "backoff_limit_total",
    "control_job_name",
    "control_job_spec",
    "dump",
    "grace_period",
    "has_control_job",
    "host_copies_per_rank",
    "host_copy_bytes",
    "is_rdma_resource",
    "jobset_failure_policy",
    "jobset_webhook_problems",
    "keeps_host_copy",
    "kubernetes_version",
    "manifest_from_file",
    "notes",
    "per_index",
    "ranks_per_pod",
    "rdma_flags",
    "render",
    "runtime",
    "selector",
    "sends_peer_copy",
]

CONTAINER = "trainer"
"""Name of the training container (``podFailurePolicy`` matches its exit codes)."""

POLICY_MOUNT = "/etc/nvtrain"
POLICY_FILE = "policy.toml"

CONTROL_CONTAINER = "control"
"""Name of the container of the control pod (``[rendezvous] store = "control"``)."""

COMPONENT_LABEL = "app.kubernetes.io/component"
"""Set to ``control`` on the control Job and its pod only (the training pods keep the labels
they always had); ``kubectl logs -l app.kubernetes.io/component=control`` finds the store."""

CONTROL_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "250m", "memory": "1Gi"},
    "limits": {"memory": "2Gi"},
}
"""The control pod's resources. It runs the training image, and importing PyTorch alone takes a
few hundred MiB (220 MiB for a CPU build, more for a CUDA build); the store's keys are small.
Requesting 1Gi keeps the pod below its request, so it is among the last evicted when a node runs
short of memory (losing it loses the store); the 2Gi limit caps a leak. No CPU limit: a
throttled store delays every launcher's rendezvous and heartbeat calls."""

GRACE_MARGIN = 30
"""Seconds the pod's grace period adds to ``[job] stop_timeout``. On SIGTERM ``nvtrain run``
gives ft_launcher and the workers ``stop_timeout`` (ft_launcher's ``--term-timeout``), kills what
is left 5 s later and writes the termination log; the rest covers process start-up of the
signal handlers and kubelet latency. Kubernetes SIGKILLs the pod when the grace period ends."""

CONFIGMAP_LIMIT = 1024 * 1024
"""Kubernetes' limit on the data of one ConfigMap (1 MiB); the policy's text is all of it."""

_INT32_MAX = 2**31 - 1
"""Kubernetes' ``backoffLimit`` is an int32; device counts beyond it are never meant either."""

OLDEST_KUBERNETES = (1, 28)
"""The oldest Kubernetes the manifests work on (Indexed Jobs, pod failure policy, the
``batch.kubernetes.io/controller-uid`` label)."""

PER_INDEX_SINCE = (1, 33)
"""Kubernetes version from which the training Job gets ``backoffLimitPerIndex``: GA there (beta,
on by default, since 1.29; a cluster may have turned it off before 1.33)."""

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"

NEVER_RETRY = (int(ExitCode.USAGE), int(ExitCode.ESCALATED))
"""Exit codes that fail the Job at once: an invalid policy (2) and escalation (4)."""

JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")

SHM_MOUNT = "/dev/shm"

HOST_COPY_SLOTS = 2
"""Copies of its checkpoint state that each rank keeps in ``[checkpoint] memory_dir``: the
newest committed one stays whole while the next save is staged into the other slot."""

PEER_COPY_SLOTS = 1
"""Copies of another rank's state that each rank keeps in ``memory_dir`` with ``[checkpoint]
peer_copy``: the sealed host copy of the rank with the same local rank on the previous pod."""

HOST_COPY_VOLUME = "hostcopy"
"""The memory-backed emptyDir mounted at a ``memory_dir`` outside ``/dev/shm``."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ManifestOptions:
    """What the manifests need that the policy does not say: the cluster side of the job."""

    image: str | None = None
    """Training image (built from the starter Dockerfile). Default: ``<job name>:latest``."""
    gpus_per_node: int | None = None
    """``nvidia.com/gpu`` per pod. Default: ``[job] nproc_per_node`` when it is a number and
    the backend is not gloo; 0 for gloo or ``"cpu"``; ``"gpu"`` needs it given."""
    efa: int = 0
    """``vpc.amazonaws.com/efa`` devices per pod (AWS); adds the IPC_LOCK capability."""
    resources: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Other extended resources per pod, e.g. ``{"nvidia.com/mig-3g.40gb": 1}`` or
    ``{"rdma/hca_shared_devices_a": 1}``. Only those whose name says RDMA (``is_rdma_resource``)
    add the IPC_LOCK capability; ``nvidia.com/gpu`` and ``vpc.amazonaws.com/efa`` are refused
    (``--gpus`` and ``--efa`` set them)."""
    rdma_resources: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Extended resources per pod that are RDMA devices whatever their name (``--rdma-resource``):
    each adds the IPC_LOCK capability, as ``efa`` does."""
    cpu: str | None = None
    """CPU request (a Kubernetes quantity such as ``"90"`` or ``"500m"``)."""
    memory: str | None = None
    """Memory request and limit (a quantity such as ``"900Gi"``)."""
    checkpoint_pvc: str | None = None
    """PersistentVolumeClaim (ReadWriteMany) mounted at ``[checkpoint] dir`` on every pod.
    Default: ``<job name>-checkpoints``."""
    shm_size: str = "16Gi"
    """Size of the memory-backed ``/dev/shm`` (data-loader workers pass batches through it)."""
    state_per_rank: str | None = None
    """Checkpoint state (model + optimizer shard) of one rank, a quantity such as ``"20Gi"``.
    When the policy keeps host copies (``keeps_host_copy``), ``host_copies_per_rank`` × this × the
    ranks of a pod is added to ``/dev/shm`` (``memory_dir`` in it) or mounted as a memory-backed
    emptyDir at ``memory_dir``. Unset: the sizes stay as they are and ``notes`` says so."""
    backoff_limit: int = 6
    """Failures of each pod (each index) that the Job retries (exit codes other than 2 and 4)
    before it fails: the Job's ``backoffLimit`` is this × the pods (``backoff_limit_total``), so
    that one wave of failures of every pod (DNS not ready, a node pool restarted) does not fail a
    large job; with ``kubernetes`` 1.33 or later also ``backoffLimitPerIndex``."""
    kubernetes: str = "1.28"
    """Oldest Kubernetes version (``MAJOR.MINOR``) of the clusters the manifest is for. From
    ``PER_INDEX_SINCE`` (1.33, where ``backoffLimitPerIndex`` is GA) the training Job also gets
    ``backoffLimitPerIndex`` and ``maxFailedIndexes: 0``."""
    jobset: bool = False
    """Render a JobSet instead of the Job (and let JobSet create the headless Service)."""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Extra labels on every object and pod."""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Extra environment variables of the training container (e.g. NCCL settings)."""
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Node labels the training pods must run on (``nodeSelector``). Not the control pod's: it
    needs no GPU node."""
    nvrx_version: str | None = None
    """NVRx version of the training image (``"0.7.0"``): ``manifest_from_file`` checks the policy
    against it, and the training pods record it in the annotation ``nvtrain.dev/nvrx-version``
    for ``nvtrain validate --manifest`` (``nvtrain.templates.nvrx_pin``). None: neither."""
    qos: str = "burstable"
    """``"burstable"``: CPU and memory requested (by default sized from the ranks of a pod), the
    memory limit equal to its request, no CPU limit; ``"guaranteed"``: every limit equal to its
    request. See ``nvtrain.templates.qos``."""
    pod_security: str | None = None
    """Pod Security Standards level every pod must pass, ``"baseline"`` or ``"restricted"``
    (``nvtrain.templates.podsecurity``); None renders no security context but IPC_LOCK for RDMA."""
    run_as_user: int | None = None
    """User and group id of every pod. Default: 1000 with ``pod_security = "restricted"``,
    otherwise the image's user."""
    tolerations: Sequence[str] = ()
    """Tolerations of every pod, each ``KEY[=VALUE]:EFFECT``."""
    priority_class: str | None = None
    """``priorityClassName`` of every pod."""
    scheduler_name: str | None = None
    """``schedulerName`` of every pod; ``"volcano"`` also renders a Volcano PodGroup."""
    service_account: str | None = None
    """``serviceAccountName`` of every pod (its API token stays unmounted)."""
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Extra annotations on every pod."""
    ttl: int | None = None
    """``ttlSecondsAfterFinished`` of the Jobs (or the JobSet): deleted that long after they end."""
    queue: str | None = None
    """Kueue LocalQueue of the workload, or the Volcano queue with ``scheduler_name = "volcano"``."""
    pod_monitor: bool = False
    """Also render a Prometheus Operator PodMonitor for the metrics port (needs ``[metrics]``)."""
    metrics_from: str | None = None
    """Namespace of the Prometheus that scrapes the metrics port (``--metrics-from``): the
    NetworkPolicy admits that port only from pods of this namespace. None: from every source."""
    secret_env: Sequence[str] = ()
    """Secrets whose keys become environment variables of the training container (``envFrom``)."""
    volumes: Sequence[str] = ()
    """Extra volumes of the training container, each ``KIND:NAME:PATH[:ro]`` with KIND ``pvc``,
    ``secret`` or ``configmap`` (``podextras.extra_volume``)."""
    init_containers: Sequence[Mapping[str, Any]] = ()
    """Init containers of the training pods, as in a pod spec (each with a name and an image)."""
    affinity: Mapping[str, Any] | None = None
    """``affinity`` of the training pods (``nodeAffinity``, ``podAffinity``, ``podAntiAffinity``)."""
    exclusive_topology: str | None = None
    """Node label of the JobSet's exclusive placement (``--jobset`` or ``trainer_runtime``):
    the annotation ``alpha.jobset.sigs.k8s.io/exclusive-topology``."""
    required_topology: str | None = None
    """Kueue Topology Aware Scheduling: the training pods only inside one domain of this node
    label (``kueue.x-k8s.io/podset-required-topology``)."""
    preferred_topology: str | None = None
    """As ``required_topology``, as far as possible (``kueue.x-k8s.io/podset-preferred-topology``)."""
    monitoring_rules: bool = False
    """Also render the job's Prometheus alerts (a PrometheusRule) and a Grafana dashboard (a
    ConfigMap); needs ``[metrics]``. See ``nvtrain.templates.alerts``."""
    trainer_runtime: str | None = None
    """``"cluster"``: render a Kubeflow Trainer v2 ``ClusterTrainingRuntime`` instead of the
    Job (and no Service: JobSet makes it); ``"namespaced"``: a ``TrainingRuntime`` in
    ``[rendezvous] namespace``. See ``nvtrain.templates.trainer_runtime``."""


def grace_period(policy: Policy) -> int:
    """``terminationGracePeriodSeconds``: ``[job] stop_timeout`` plus ``GRACE_MARGIN``."""
    return math.ceil(policy.job.stop_timeout) + GRACE_MARGIN


def selector(policy: Policy) -> dict[str, str]:
    """Labels that pick exactly the pods of this job (Service, NetworkPolicy)."""
    return {"app.kubernetes.io/name": "nvtrain", "app.kubernetes.io/instance": policy.job.name}


def _labels(policy: Policy, options: ManifestOptions, *, component: str | None = None) -> dict[str, str]:
    own = {**selector(policy), "app.kubernetes.io/managed-by": "nvtrain"}
    if component is not None:
        own[COMPONENT_LABEL] = component
    return {**own, **options.labels}


def has_control_job(policy: Policy) -> bool:
    """Whether the manifests hold the control Job: ``[rendezvous] store = "control"`` and 2 or
    more nodes (one node runs standalone on localhost, with no store to move)."""
    return policy.rendezvous.store == "control" and policy.rendezvous.nodes >= 2


def control_job_name(policy: Policy) -> str:
    """``<job>-control``: the control Job, and its pod's hostname."""
    return f"{policy.job.name}-{CONTROL_SUFFIX}"


def _meta(name: str, policy: Policy, options: ManifestOptions) -> dict[str, Any]:
    return {"name": name, "namespace": policy.rendezvous.namespace, "labels": _labels(policy, options)}


def policy_configmap_name(policy: Policy, policy_text: str) -> str:
    digest = hashlib.sha256(policy_text.encode("utf-8")).hexdigest()[:10]
    return f"{policy.job.name}-policy-{digest}"


def configmap(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """The policy file, as one string value, in an immutable ConfigMap."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(policy_configmap_name(policy, policy_text), policy, options),
        "immutable": True,
        "data": {POLICY_FILE: policy_text},
    }


def service(policy: Policy, options: ManifestOptions) -> dict[str, Any]:
    """The headless Service behind the pods' DNS names; not-ready pods are published too,
    since peers must find each other before any pod is ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(policy.service, policy, options),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector(policy),
            "ports": [
                {
                    "name": "rendezvous",
                    "port": policy.rendezvous.port,
                    "targetPort": policy.rendezvous.port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def network_policy(policy: Policy, options: ManifestOptions) -> dict[str, Any]:
    """Ingress to the job's pods only from pods of the same job, on every port: the c10d store
    has no authentication, and collectives and the in-process store use ephemeral ports. With
    ``[metrics]`` on, its port alone is open to Prometheus: to the pods of the namespace
    ``options.metrics_from``, or to every source without it (``monitoring.metrics_ingress``)."""
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": {"matchLabels": selector(policy)}}]}]
    if policy.metrics.enabled:
        ingress.append(monitoring.metrics_ingress(policy.metrics.port, options.metrics_from))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(f"{policy.job.name}-peers", policy, options),
        "spec": {
            "podSelector": {"matchLabels": selector(policy)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def gpus(policy: Policy, options: ManifestOptions) -> int:
    """GPUs per pod: given, or one per worker process (none for gloo or "cpu")."""
    nproc, backend = policy.job.nproc_per_node, policy.job.backend
    if options.gpus_per_node is not None:
        count = options.gpus_per_node
        if count < 0:
            raise UsageError(f"--gpus {count} is negative", "give 0 or more GPUs per pod")
        if count > MAX_NPROC:
            raise UsageError(
                f"--gpus {count} is more GPUs than a pod can have (at most {MAX_NPROC})",
                "give the GPUs of one node, e.g. --gpus 8",
            )
        if isinstance(nproc, int) and count > 0 and count != nproc:
            raise UsageError(
                f"--gpus {count} disagrees with [job] nproc_per_node = {nproc}: each worker "
                "process uses one GPU",
                f'use --gpus {nproc}, or change nproc_per_node to {count} (or to "gpu")',
            )
        return count
    if backend == "gloo" or nproc == "cpu":
        return 0
    if nproc == "gpu":
        raise UsageError(
            '[job] nproc_per_node = "gpu" does not say how many GPUs each pod needs',
            "pass --gpus N (the GPUs of one node), or set nproc_per_node to a number",
        )
    assert isinstance(nproc, int)
    return nproc


def keeps_host_copy(policy: Policy) -> bool:
    """Whether ``nvtrain run`` keeps each rank's staged checkpoint in ``[checkpoint]
    memory_dir``: with ``async`` and ``in_memory`` on and ``memory_dir`` not ``""``."""
    c = policy.checkpoint
    return c.async_ and c.in_memory and bool(c.memory_dir)


def sends_peer_copy(policy: Policy) -> bool:
    """Whether each rank also keeps a peer's host copy (``[checkpoint] peer_copy``): with the
    host copy kept and more than one pod, so that there is a next pod to send it to."""
    return keeps_host_copy(policy) and policy.checkpoint.peer_copy and policy.rendezvous.nodes > 1


def host_copies_per_rank(policy: Policy) -> int:
    """Copies of a rank's checkpoint state that ``[checkpoint] memory_dir`` holds per rank of a
    pod: ``HOST_COPY_SLOTS`` of its own, plus ``PEER_COPY_SLOTS`` with the peer copy
    (``sends_peer_copy``); 0 when the policy keeps no host copy. The one source of the sizes."""
    if not keeps_host_copy(policy):
        return 0
    return HOST_COPY_SLOTS + (PEER_COPY_SLOTS if sends_peer_copy(policy) else 0)


def _host_copies_made_of(policy: Policy) -> str:
    """What ``host_copies_per_rank`` counts, in words, for the notes and errors."""
    own = f"{HOST_COPY_SLOTS} slots of its own"
    if sends_peer_copy(policy):
        return f"{own} + {PEER_COPY_SLOTS} peer copy of the same local rank on the previous pod"
    return own


def _known_ranks(policy: Policy, options: ManifestOptions) -> int | None:
    nproc = policy.job.nproc_per_node
    if isinstance(nproc, int):
        return nproc
    if nproc == "gpu" and options.gpus_per_node:
        return options.gpus_per_node
    return None


def ranks_per_pod(policy: Policy, options: ManifestOptions) -> int:
    """Worker processes (ranks) of one pod: ``[job] nproc_per_node``, or with ``"gpu"`` the
    GPUs of the pod (``--gpus``). ``"cpu"`` (one per CPU core of the node) cannot be known."""
    nproc = policy.job.nproc_per_node
    if nproc == "gpu":
        gpus(policy, options)  # the usual error without --gpus, and its range checks
    ranks = _known_ranks(policy, options)
    if ranks is not None:
        return ranks
    if nproc == "gpu":
        raise UsageError(
            '[job] nproc_per_node = "gpu" with no GPUs per pod does not say how many ranks a pod '
            "runs, so --state-per-rank cannot size the host copies",
            "pass --gpus N (the GPUs of one node), or set nproc_per_node to a number",
        )
    raise UsageError(
        '[job] nproc_per_node = "cpu" (one rank per CPU core of the node) does not say how many '
        "ranks a pod runs, so --state-per-rank cannot size the host copies",
        "set nproc_per_node to the number of ranks of one pod, or leave out --state-per-rank "
        "(and size the memory yourself)",
    )


def _state_bytes(options: ManifestOptions) -> Fraction | None:
    if options.state_per_rank is None:
        return None
    state = _check_quantity("--state-per-rank", options.state_per_rank)
    if state <= 0:
        raise UsageError(
            f"--state-per-rank {options.state_per_rank!r} is not a size",
            'give the checkpoint state (model + optimizer) of one rank, e.g. "20Gi"',
        )
    return state


def host_copy_bytes(policy: Policy, options: ManifestOptions) -> Fraction | None:
    """Memory the host copies of one pod take: ``host_copies_per_rank`` × ``--state-per-rank`` ×
    ``ranks_per_pod``; None without ``--state-per-rank`` or when the policy keeps no copy."""
    state = _state_bytes(options)
    copies = host_copies_per_rank(policy)
    if state is None or not copies:
        return None
    return copies * state * ranks_per_pod(policy, options)


def _in_shm(directory: str) -> bool:
    path, shm = PurePosixPath(directory), PurePosixPath(SHM_MOUNT)
    return path == shm or shm in path.parents


def _shm_size(policy: Policy, options: ManifestOptions) -> str:
    """``sizeLimit`` of ``/dev/shm``: ``--shm-size``, plus the host copies when they live there."""
    host = host_copy_bytes(policy, options)
    if host is None or not _in_shm(policy.checkpoint.memory_dir):
        return options.shm_size
    return _quantity(_check_quantity("--shm-size", options.shm_size) + host)


def _host_copy_volume(policy: Policy, options: ManifestOptions) -> str | None:
    """``sizeLimit`` of the emptyDir mounted at a ``memory_dir`` outside ``/dev/shm``, or None
    when there is none (no copy, ``memory_dir`` in ``/dev/shm``, or no ``--state-per-rank``)."""
    host = host_copy_bytes(policy, options)
    if host is None or _in_shm(policy.checkpoint.memory_dir):
        return None
    return _quantity(host)


def _check_memory_dir(policy: Policy) -> None:
    """A ``memory_dir`` outside ``/dev/shm`` must be a mount point of its own, as the checkpoint
    dir must (``_check``); one in ``/dev/shm`` needs no mount but must stay in it."""
    directory = policy.checkpoint.memory_dir
    if not keeps_host_copy(policy):
        return
    clean = PurePosixPath(directory)
    key = f"[checkpoint] memory_dir {directory!r}"
    if ".." in clean.parts:
        raise UsageError(f"{key} contains '..'", 'use a plain absolute path such as "/dev/shm" (the default)')
    if _in_shm(directory):
        return
    if _CONTROL.search(directory) or ":" in directory:
        raise UsageError(
            f"{key} contains a control character or ':', which Kubernetes does not allow in a "
            "volume's mountPath",
            'use a plain absolute path such as "/dev/shm" (the default)',
        )
    others = {
        POLICY_MOUNT: PurePosixPath(POLICY_MOUNT),
        "[checkpoint] dir": PurePosixPath(policy.checkpoint.dir),
    }
    overlaps = [name for name, o in others.items() if clean == o or o in clean.parents or clean in o.parents]
    system = [PurePosixPath(p) for p in ("/dev", "/proc", "/sys")]
    if clean == PurePosixPath("/") or any(clean == s or s in clean.parents for s in system) or overlaps:
        raise UsageError(
            f"{key} cannot be mounted as the memory-backed volume of the host copies: it is /, "
            f"lies in /dev (outside /dev/shm), /proc or /sys, or overlaps {POLICY_MOUNT} or "
            "[checkpoint] dir",
            'use "/dev/shm" (the default) or a directory of its own, such as "/hostcopy"',
        )


def _check_pairs(kind: str, pairs: Mapping[str, str], key: re.Pattern[str], value: re.Pattern[str]) -> None:
    for k, v in pairs.items():
        if not key.fullmatch(k) or len(k) > 253:
            raise UsageError(
                f"{kind} name {k!r} is not valid",
                "use a Kubernetes qualified name, e.g. example.com/team or team",
            )
        if not value.fullmatch(v):
            raise UsageError(
                f"{kind} {k}={v!r}: the value is not valid",
                "use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            )


def _check(policy: Policy, options: ManifestOptions) -> None:
    image = _image(policy, options)
    if not image or any(c.isspace() for c in image) or _CONTROL.search(image):
        raise UsageError(
            f"--image {image!r} is not an image reference",
            "give e.g. registry.example.com/team/train:1.0 (no spaces)",
        )
    pvc = _pvc(policy, options)
    if not re.fullmatch(_DNS_SUBDOMAIN, pvc) or len(pvc) > 253:
        raise UsageError(
            f"--checkpoint-pvc {pvc!r} is not a PersistentVolumeClaim name",
            "use lowercase letters, digits, '-' and '.'",
        )
    directory = policy.checkpoint.dir
    if _CONTROL.search(directory):
        raise UsageError(
            f"[checkpoint] dir {directory!r} contains control characters (e.g. a newline)",
            'use a plain absolute path such as "/checkpoints"',
        )
    if ":" in directory:
        raise UsageError(
            f"[checkpoint] dir {directory!r} contains ':', which Kubernetes does not allow in a "
            "volume's mountPath",
            'use a path without a colon, such as "/checkpoints"',
        )
    clean = PurePosixPath(directory)
    policy_mount = PurePosixPath(POLICY_MOUNT)
    system = [PurePosixPath(p) for p in ("/dev", "/proc", "/sys")]
    if (
        ".." in clean.parts
        or clean == PurePosixPath("/")
        or any(clean == s or s in clean.parents for s in system)
        or clean == policy_mount
        or policy_mount in clean.parents
        or clean in policy_mount.parents
    ):
        raise UsageError(
            f"[checkpoint] dir {directory!r} cannot be mounted as the checkpoint volume: it is "
            f"/, contains '..', lies in /dev, /proc or /sys, or overlaps {POLICY_MOUNT}",
            'use a directory of its own, such as "/checkpoints"',
        )
    for flag, count in (("--backoff-limit", options.backoff_limit), ("--efa", options.efa)):
        if count < 0:
            raise UsageError(f"{flag} {count} is negative", f"give {flag} 0 or more")
        if count > _INT32_MAX:
            raise UsageError(
                f"{flag} {count} is too large (Kubernetes holds at most {_INT32_MAX:,})",
                f"give {flag} a count such as 6",
            )
    shm = _check_quantity("--shm-size", options.shm_size)
    _check_memory_dir(policy)
    host = host_copy_bytes(policy, options)
    if options.cpu is not None:
        _check_quantity("--cpu", options.cpu)
    if options.memory is not None:
        memory = _check_quantity("--memory", options.memory)
        if host is None and shm >= memory:
            raise UsageError(
                f"--shm-size {options.shm_size} is not below --memory {options.memory}: "
                "/dev/shm is memory-backed and counts against the pod's memory limit",
                "lower --shm-size or raise --memory",
            )
        if host is not None and shm + host >= memory:
            raise UsageError(
                f"--shm-size {options.shm_size} plus the host copies "
                f"({host_copies_per_rank(policy)} × --state-per-rank {options.state_per_rank} × "
                f"{ranks_per_pod(policy, options)} ranks = {_quantity(host)}; per rank "
                f"{_host_copies_made_of(policy)}) is {_quantity(shm + host)} of memory-backed volumes, "
                f"not below --memory {options.memory}: they count against the pod's memory limit",
                "raise --memory, or lower --shm-size",
            )
    _check_resources(options)
    kubernetes_version(options)
    _check_extras(policy, options)
    _check_pairs("label", options.labels, _QUALIFIED, _LABEL_VALUE)
    _check_platform(policy, options)
    _check_pairs("node selector", options.node_selector, _QUALIFIED, _LABEL_VALUE)
    reserved_labels = set(selector(policy)) | {"app.kubernetes.io/managed-by"}
    if has_control_job(policy):
        reserved_labels.add(COMPONENT_LABEL)
    clash = sorted(reserved_labels & set(options.labels))
    if clash:
        raise UsageError(f"label {clash[0]} is set by nvtrain", "choose another label name")
    own = {e["name"] for e in _env(policy, options, uid_label=JOB_UID_LABEL, extra=False)}
    for name in options.env:
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"--env {name!r} is not an environment variable name", "e.g. NCCL_DEBUG")
        if name in own:
            raise UsageError(f"--env {name} is set by the manifest itself", "leave it out")


def _reserved_mounts(policy: Policy) -> dict[str, str]:
    """Paths of the training container that nvtrain mounts (path: what it mounts there)."""
    reserved = {
        POLICY_MOUNT: "the policy",
        policy.checkpoint.dir: "the checkpoint volume ([checkpoint] dir)",
        SHM_MOUNT: "the memory-backed /dev/shm",
    }
    if keeps_host_copy(policy) and not _in_shm(policy.checkpoint.memory_dir):
        reserved[policy.checkpoint.memory_dir] = "the host copies ([checkpoint] memory_dir)"
    return reserved


def _check_extras(policy: Policy, options: ManifestOptions) -> None:
    """Secrets, volumes, init containers and placement (``podextras``), and the Trainer runtime."""
    podextras.check_secret_env(options.secret_env)
    volumes = [podextras.extra_volume(v) for v in options.volumes]
    podextras.check_volumes(volumes, _reserved_mounts(policy))
    podextras.check_init_containers(options.init_containers, (CONTAINER, CONTROL_CONTAINER))
    podextras.check_affinity(options.affinity)
    podextras.check_topology(
        exclusive=options.exclusive_topology,
        required=options.required_topology,
        preferred=options.preferred_topology,
        jobset=options.jobset or options.trainer_runtime is not None,
    )
    if options.trainer_runtime is not None:
        trainer_runtime.check_runtime(
            options.trainer_runtime,
            jobset=options.jobset,
            control_store=has_control_job(policy),
            scheduler_name=options.scheduler_name,
            queue=options.queue,
        )


def _check_resources(options: ManifestOptions) -> None:
    """``--resource`` and ``--rdma-resource``: extended resource names, counts of 1 or more, and
    not the resources that ``--gpus`` and ``--efa`` set (one would silently replace the other)."""
    own = {GPU_RESOURCE: "--gpus", EFA_RESOURCE: "--efa"}
    flags = {"--resource": options.resources, "--rdma-resource": options.rdma_resources}
    for flag, resources in flags.items():
        for name, count in resources.items():
            if not _QUALIFIED.fullmatch(name) or "/" not in name:
                raise UsageError(
                    f"{flag} {name!r} is not an extended resource name",
                    "use a domain-prefixed name such as rdma/hca_shared_devices_a",
                )
            if count < 1:
                raise UsageError(f"{flag} {name}={count}: the count must be at least 1")
            if name in own:
                raise UsageError(
                    f"{flag} {name}={count} would replace what {own[name]} sets: the pods' "
                    f"{name} comes from {own[name]}",
                    f"use {own[name]} {count} instead",
                )
    both = sorted(set(options.resources) & set(options.rdma_resources))
    if both:
        raise UsageError(
            f"{both[0]} is given with both --resource and --rdma-resource",
            "give it once: --rdma-resource for an RDMA device, --resource otherwise",
        )


def is_rdma_resource(name: str) -> bool:
    """Whether the extended resource ``name`` is taken for an RDMA device without being told:
    its name holds ``rdma`` or ``hca`` (``rdma/hca_shared_devices_a``, ``rdma/ib``, SR-IOV RDMA
    pools). Any other (``nvidia.com/mig-3g.40gb``, ``example.com/fpga``) is not: a MIG slice
    needs no IPC_LOCK, and the pod can stay ``restricted``. ``--rdma-resource`` names others."""
    lowered = name.lower()
    return "rdma" in lowered or "hca" in lowered.rpartition("/")[2]


def rdma_flags(options: ManifestOptions) -> list[str]:
    """The options that make the training container an RDMA user (IPC_LOCK), as given."""
    found = [f"--efa {options.efa}"] if options.efa else []
    found += [f"--resource {n}={c}" for n, c in options.resources.items() if is_rdma_resource(n)]
    found += [f"--rdma-resource {n}={c}" for n, c in options.rdma_resources.items()]
    return found


def kubernetes_version(options: ManifestOptions) -> tuple[int, int]:
    """``options.kubernetes`` as (major, minor); ``UsageError`` when it is not ``MAJOR.MINOR``
    or older than ``OLDEST_KUBERNETES``."""
    text = options.kubernetes
    found = re.fullmatch(r"v?(\d{1,3})\.(\d{1,3})(\.\d+)?", text.strip())
    oldest = ".".join(map(str, OLDEST_KUBERNETES))
    if found is None:
        raise UsageError(
            f"--kubernetes {text!r} is not a Kubernetes version",
            f"give the oldest version of your clusters as MAJOR.MINOR, e.g. {oldest} or 1.33",
        )
    version = (int(found.group(1)), int(found.group(2)))
    if version < OLDEST_KUBERNETES:
        raise UsageError(
            f"--kubernetes {text} is older than the oldest Kubernetes the manifests work on ({oldest}): "
            "they need Indexed Jobs, the pod failure policy and the controller-uid label",
            f"upgrade the cluster to {oldest} or later",
        )
    return version


def per_index(options: ManifestOptions) -> bool:
    """Whether the training Job gets ``backoffLimitPerIndex`` (``--kubernetes`` 1.33 or later)."""
    return kubernetes_version(options) >= PER_INDEX_SINCE


def backoff_limit_total(pods: int, options: ManifestOptions) -> int:
    """A Job's ``backoffLimit``: ``--backoff-limit`` failures for each of its ``pods``, at most
    what an int32 holds. A failure that hits every pod at once (DNS not ready yet, a node pool
    restarted) costs one failure per pod; a fixed limit would fail a large job on the first one."""
    return min(options.backoff_limit * pods, _INT32_MAX)


def _image(policy: Policy, options: ManifestOptions) -> str:
    return options.image if options.image is not None else f"{policy.job.name}:latest"


def _pvc(policy: Policy, options: ManifestOptions) -> str:
    return options.checkpoint_pvc or f"{policy.job.name}-checkpoints"


def _rdma(options: ManifestOptions) -> bool:
    return bool(rdma_flags(options))


def _env(policy: Policy, options: ManifestOptions, *, uid_label: str, extra: bool = True) -> list[Any]:
    env = [
        _field_env("POD_IP", "status.podIP"),
        _field_env("JOB_COMPLETION_INDEX", f"metadata.annotations['{INDEX_ANNOTATION}']"),
        _field_env("NVTRAIN_RUN_ID", f"metadata.labels['{uid_label}']"),
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if policy.restart.in_process.enabled and gpus(policy, options) > 0:
        # NVRx in-process restart needs both (docs/kubernetes.md, "Environment").
        env += [
            {"name": "NCCL_NVLS_ENABLE", "value": "0"},
            {"name": "TORCH_NCCL_RETHROW_CUDA_ERRORS", "value": "0"},
        ]
    if extra:
        env += [{"name": k, "value": v} for k, v in options.env.items()]
    return env


def _resources(policy: Policy, options: ManifestOptions) -> dict[str, Any]:
    extended: dict[str, int] = {}
    count = gpus(policy, options)
    if count:
        extended[GPU_RESOURCE] = count
    if options.efa:
        extended[EFA_RESOURCE] = options.efa
    extended.update(options.resources)
    extended.update(options.rdma_resources)
    # Every medium: Memory volume counts against the memory limit: /dev/shm and the host copies
    # (in /dev/shm or in a volume of their own, the same bytes either way).
    memory_backed = _check_quantity("--shm-size", options.shm_size) + (host_copy_bytes(policy, options) or 0)
    return qos.training_resources(
        extended=extended,
        ranks=_known_ranks(policy, options),
        memory_backed=memory_backed,
        cpu=options.cpu,
        memory=options.memory,
        qos=options.qos,
    )


def _platform_pod(policy: Policy, options: ManifestOptions, pod: dict[str, Any]) -> None:
    """Add to ``pod`` (a training or control pod template) what the platform options ask of
    every pod: annotations, the Volcano group, scheduler, priority, service account, tolerations
    and security contexts."""
    metadata, spec = pod["metadata"], pod["spec"]
    annotations = dict(options.annotations)
    if options.scheduler_name == scheduling.VOLCANO:
        annotations[scheduling.GROUP_ANNOTATION] = policy.job.name
    if annotations:
        metadata.setdefault("annotations", {}).update(annotations)
    for key, value in (
        ("schedulerName", options.scheduler_name),
        ("priorityClassName", options.priority_class),
        ("serviceAccountName", options.service_account),
    ):
        if value is not None:
            spec[key] = value
    tolerations: list[dict[str, str]] = list(spec.get("tolerations", []))
    for wanted in map(scheduling.toleration, options.tolerations):
        if wanted not in tolerations:
            tolerations.append(wanted)
    if tolerations:
        spec["tolerations"] = tolerations
    context = podsecurity.pod_context(options.pod_security, options.run_as_user)
    if context is not None:
        spec["securityContext"] = context
    for container in spec["containers"]:
        rdma = _rdma(options) and container["name"] == CONTAINER
        container_context = podsecurity.container_context(options.pod_security, rdma=rdma)
        if container_context is not None:
            container["securityContext"] = container_context


def _check_platform(policy: Policy, options: ManifestOptions) -> None:
    """The platform options (QoS, Pod Security, scheduling, PodMonitor); see ``_platform_pod``."""
    qos.check_qos(options.qos)
    podsecurity.check_pod_security(options.pod_security, options.run_as_user, rdma_flags(options))
    scheduling.check_scheduling(
        tolerations=options.tolerations,
        priority_class=options.priority_class,
        scheduler_name=options.scheduler_name,
        service_account=options.service_account,
        queue=options.queue,
        ttl=options.ttl,
    )
    reserved = {
        INDEX_ANNOTATION,
        scheduling.GROUP_ANNOTATION,
        NVRX_ANNOTATION,
        podextras.REQUIRED_TOPOLOGY,
        podextras.PREFERRED_TOPOLOGY,
    }
    if policy.metrics.enabled:
        reserved |= {"prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path"}
    scheduling.check_annotations(options.annotations, reserved)
    monitoring.check_pod_monitor(options.pod_monitor, policy.metrics.enabled)
    monitoring.check_monitoring_rules(options.monitoring_rules, policy.metrics.enabled)
    monitoring.check_metrics_from(options.metrics_from, policy.metrics.enabled)
    scheduling.check_queue(
        options.queue,
        scheduler_name=options.scheduler_name,
        labels=options.labels,
        two_jobs=has_control_job(policy) and not options.jobset,
    )


def pod_template(
    policy: Policy, policy_text: str, options: ManifestOptions, *, uid_label: str
) -> dict[str, Any]:
    """The pod: ``nvtrain run`` on the mounted policy, with identity, storage and resources."""
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": _image(policy, options),
        "imagePullPolicy": scheduling.pull_policy(_image(policy, options)),
        "command": ["nvtrain", "run", f"{POLICY_MOUNT}/{POLICY_FILE}"],
        "env": _env(policy, options, uid_label=uid_label),
        "ports": [{"name": "rendezvous", "containerPort": policy.rendezvous.port, "protocol": "TCP"}],
    }
    metadata: dict[str, Any] = {"labels": _labels(policy, options)}
    if policy.metrics.enabled:
        container["ports"].append(
            {"name": "metrics", "containerPort": policy.metrics.port, "protocol": "TCP"}
        )
        # The annotations that Prometheus' common Kubernetes pod discovery configuration reads.
        metadata["annotations"] = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(policy.metrics.port),
            "prometheus.io/path": "/metrics",
        }
    resources = _resources(policy, options)
    if resources:
        container["resources"] = resources
    container["volumeMounts"] = [
        {"name": "policy", "mountPath": POLICY_MOUNT, "readOnly": True},
        {"name": "checkpoints", "mountPath": policy.checkpoint.dir},
        {"name": "dshm", "mountPath": SHM_MOUNT},
    ]
    spec: dict[str, Any] = {
        "subdomain": policy.service,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace_period(policy),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [
            {"name": "policy", "configMap": {"name": policy_configmap_name(policy, policy_text)}},
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": _pvc(policy, options)}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _shm_size(policy, options)}},
        ],
    }
    host_copy = _host_copy_volume(policy, options)
    if host_copy is not None:
        container["volumeMounts"].append(
            {"name": HOST_COPY_VOLUME, "mountPath": policy.checkpoint.memory_dir}
        )
        spec["volumes"].append(
            {"name": HOST_COPY_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": host_copy}}
        )
    if options.node_selector:
        spec["nodeSelector"] = dict(options.node_selector)
    mig = any(name.startswith("nvidia.com/") for name in options.resources)
    if gpus(policy, options) or mig:  # MIG slices (nvidia.com/mig-*) are on tainted GPU nodes too
        spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    if options.nvrx_version is not None:
        pinned = str(parse_nvrx_option(options.nvrx_version))
        metadata.setdefault("annotations", {})[NVRX_ANNOTATION] = pinned
    pod = {"metadata": metadata, "spec": spec}
    _training_extras(options, pod)
    _platform_pod(policy, options, pod)
    for init in spec.get("initContainers", []):
        context = podsecurity.container_context(options.pod_security, rdma=False)
        if context is not None and "securityContext" not in init:
            init["securityContext"] = context
    return pod


def _training_extras(options: ManifestOptions, pod: dict[str, Any]) -> None:
    """Add to the training ``pod`` its Secrets as environment, extra volumes, init containers,
    affinity and Kueue topology annotation (``podextras``)."""
    metadata, spec = pod["metadata"], pod["spec"]
    container = spec["containers"][0]
    if options.secret_env:
        container["envFrom"] = [{"secretRef": {"name": name}} for name in options.secret_env]
    volumes, mounts = podextras.volume_entries([podextras.extra_volume(v) for v in options.volumes])
    container["volumeMounts"] += mounts
    spec["volumes"] += volumes
    if options.init_containers:
        spec["initContainers"] = copy.deepcopy([dict(c) for c in options.init_containers])
    if options.affinity is not None:
        spec["affinity"] = copy.deepcopy(dict(options.affinity))
    topology = podextras.topology_annotations(options.required_topology, options.preferred_topology)
    if topology:
        metadata.setdefault("annotations", {}).update(topology)


def pod_failure_policy() -> dict[str, Any]:
    """Fail at once on exit 2 and 4; ignore disruptions (preemption, eviction, node drain);
    every other failure counts against ``backoffLimit`` (the default for unmatched failures)."""
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": list(NEVER_RETRY)},
                # Empty, so unused, but the 1.28 OpenAPI schema marks it required (a spec bug
                # fixed in 1.29); the API server checks only that one of the two is non-empty.
                "onPodConditions": [],
            },
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }


def job_spec(policy: Policy, policy_text: str, options: ManifestOptions, *, uid_label: str) -> dict[str, Any]:
    """The training Job's spec. ``backoffLimit`` grows with the pods (``backoff_limit_total``);
    with ``--kubernetes`` 1.33 or later each index also gets ``--backoff-limit`` retries of its
    own (``backoffLimitPerIndex``), and the first index that spends them fails the Job
    (``maxFailedIndexes: 0``: the other pods cannot go on without it)."""
    nodes = policy.rendezvous.nodes
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        "backoffLimit": backoff_limit_total(nodes, options),
    }
    if per_index(options):
        spec["backoffLimitPerIndex"] = options.backoff_limit
        spec["maxFailedIndexes"] = 0
    spec["podFailurePolicy"] = pod_failure_policy()
    spec["template"] = pod_template(policy, policy_text, options, uid_label=uid_label)
    return spec


def _workload(obj: dict[str, Any], options: ManifestOptions) -> dict[str, Any]:
    """``obj``, a Job or the JobSet, with ``--ttl`` and the Kueue queue label of ``--queue``
    (Kueue admits a Job or a JobSet; with Volcano the queue is the PodGroup's)."""
    if options.queue is not None and options.scheduler_name != scheduling.VOLCANO:
        obj["metadata"]["labels"][scheduling.QUEUE_LABEL] = options.queue
    if options.ttl is not None:
        obj["spec"]["ttlSecondsAfterFinished"] = options.ttl
    return obj


def job(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """The Indexed Job: one pod per node, pod *i* named ``<job>-<i>``."""
    obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(policy.job.name, policy, options),
        "spec": job_spec(policy, policy_text, options, uid_label=JOB_UID_LABEL),
    }
    return _workload(obj, options)


def control_job(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """The Job of the control pod ``<job>-control`` (``[rendezvous] store = "control"``): it runs
    ``nvtrain control`` on the mounted policy, the rendezvous store that every training pod dials
    at ``<job>-control.<service>...``. One small CPU pod: no GPUs, no checkpoint volume, no
    ``/dev/shm``, and neither the GPU toleration nor ``--node-selector`` (they are the training
    pods'). It keeps the Service's selector labels, so the headless Service gives it its DNS name
    and the NetworkPolicy admits only the job's pods to it."""
    metadata = _meta(control_job_name(policy), policy, options)
    metadata["labels"] = _labels(policy, options, component="control")
    obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": control_job_spec(policy, policy_text, options),
    }
    return _workload(obj, options)


def control_job_spec(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """The spec of the control Job (``control_job``), also the control replicated Job of the JobSet."""
    port = policy.rendezvous.port
    container: dict[str, Any] = {
        "name": CONTROL_CONTAINER,
        "image": _image(policy, options),
        "imagePullPolicy": scheduling.pull_policy(_image(policy, options)),
        "command": ["nvtrain", "control", f"{POLICY_MOUNT}/{POLICY_FILE}"],
        "env": [_field_env("POD_IP", "status.podIP"), {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "rendezvous", "containerPort": port, "protocol": "TCP"}],
        "resources": qos.control_resources(options.qos, CONTROL_RESOURCES),
        "volumeMounts": [{"name": "policy", "mountPath": POLICY_MOUNT, "readOnly": True}],
    }
    pod = {
        "metadata": {"labels": _labels(policy, options, component="control")},
        "spec": {
            "hostname": control_job_name(policy),
            "subdomain": policy.service,
            "restartPolicy": "Never",
            # `nvtrain control` too gives the store process [job] stop_timeout after SIGTERM.
            "terminationGracePeriodSeconds": grace_period(policy),
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "containers": [container],
            "volumes": [
                {"name": "policy", "configMap": {"name": policy_configmap_name(policy, policy_text)}}
            ],
        },
    }
    _platform_pod(policy, options, pod)
    return {
        "completions": 1,
        "parallelism": 1,
        "backoffLimit": backoff_limit_total(1, options),
        "podFailurePolicy": {
            "rules": [
                {
                    # Exit 2: the policy is invalid, and a new pod would read the same one.
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": CONTROL_CONTAINER,
                        "operator": "In",
                        "values": [int(ExitCode.USAGE)],
                    },
                    "onPodConditions": [],  # required by the 1.28 schema (see pod_failure_policy)
                },
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]
        },
        "template": pod,
    }


def jobset_names(policy: Policy) -> tuple[str, str]:
    """(JobSet name, replicated job name) whose pods are named ``<job name>-<index>``.

    JobSet names pods ``<jobset>-<replicated job>-<job index>-<pod index>`` and nvtrain dials
    ``<[job] name>-0``, so the job name must be ``<jobset>-<replicated job>-0``."""
    name = policy.job.name
    jobset_name, _, replicated = name.removesuffix("-0").rpartition("-")
    label = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
    if not name.endswith("-0") or not label.fullmatch(jobset_name) or not label.fullmatch(replicated):
        raise UsageError(
            f'--jobset needs [job] name of the form "<jobset>-<replicated job>-0", not "{name}": '
            "JobSet names its pods <jobset>-<replicated job>-<job index>-<pod index>, and pod 0 "
            "must be <name>-0",
            f'set name = "{name}-workers-0" (a JobSet "{name}" with replicated job "workers"), '
            "or render the plain Job",
        )
    for problem in jobset_webhook_problems(jobset_name, policy.service, name, policy.rendezvous.nodes):
        raise UsageError(
            f"--jobset: {problem}",
            "start [job] name (the JobSet's name) and [rendezvous] service with a letter, and "
            "keep them short enough, or render the plain Job",
        )
    return jobset_name, replicated


JOBSET_POD_SUFFIX = 6
"""``-abcde``: the random suffix of a pod's name that the JobSet webhook counts in (it refuses a
JobSet whose longest pod name with it is not a DNS-1035 label of at most 63 characters)."""

_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def jobset_webhook_problems(jobset_name: str, subdomain: str, job_name: str, pods: int) -> list[str]:
    """What the JobSet validating webhook refuses in a JobSet named ``jobset_name`` whose
    training replicated Job (one replica) is ``job_name`` (``<jobset>-<replicated job>-0``) with
    ``pods`` pods and whose ``network.subdomain`` is ``subdomain``: the Service and Job names it
    makes must be DNS-1035 labels (a letter first, at most 63 characters), and so must the
    longest pod name with its random suffix. Empty when it accepts them."""
    problems = []
    if not _DNS_1035.fullmatch(jobset_name):
        problems.append(
            f'the JobSet name "{jobset_name}" does not start with a letter: the JobSet webhook '
            "refuses Job names that are not DNS-1035 labels"
        )
    if not _DNS_1035.fullmatch(subdomain) or len(subdomain) > 63:
        problems.append(
            f'network.subdomain "{subdomain}" ([rendezvous] service) is not a DNS-1035 label (a '
            "letter first, at most 63 characters): the JobSet webhook refuses it, since it names a Service"
        )
    longest = f"{job_name}-{max(pods - 1, 0)}"
    if len(longest) + JOBSET_POD_SUFFIX > 63:
        problems.append(
            f"the last pod's name {longest} with the {JOBSET_POD_SUFFIX}-character random suffix "
            f"is {len(longest) + JOBSET_POD_SUFFIX} characters, more than the 63 that the JobSet "
            "webhook allows"
        )
    return problems


def _control_replicated_job(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """The control Job as a replicated Job ``control`` of the JobSet, so that the JobSet (and
    Kueue, which admits a JobSet as one workload) holds every pod of the job. ``NonIndexed``:
    the Job controller names an Indexed Job's pods itself, and the control pod keeps the hostname
    ``<job>-control`` (JobSet sets only the subdomain, the one of its headless Service, which
    selects every pod of the JobSet)."""
    jobset_name, replicated = jobset_names(policy)
    name = f"{jobset_name}-{CONTROL_SUFFIX}-0"  # JobSet names it <jobset>-<replicated job>-<index>
    if replicated == CONTROL_SUFFIX or len(name) > 63:
        raise UsageError(
            f'--jobset with [rendezvous] store = "control" adds the replicated job "{CONTROL_SUFFIX}" '
            f'(Job {name}), which clashes with the training pods\' replicated job "{replicated}" or '
            "is longer than 63 characters",
            f"name the training pods' replicated job otherwise, e.g. [job] name = "
            f'"{jobset_name}-workers-0", or shorten the JobSet name',
        )
    return {
        "name": CONTROL_SUFFIX,
        "replicas": 1,
        "template": {
            "metadata": {"labels": _labels(policy, options, component="control")},
            "spec": {"completionMode": "NonIndexed", **control_job_spec(policy, policy_text, options)},
        },
    }


def jobset(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """A JobSet with one replicated Job (one replica), and with ``[rendezvous] store =
    "control"`` a second one, ``control``; JobSet creates the headless Service named
    ``network.subdomain`` itself. Exit codes 2 and 4 fail the JobSet too."""
    jobset_name, replicated = jobset_names(policy)
    replicated_jobs: list[dict[str, Any]] = [
        {
            "name": replicated,
            "replicas": 1,
            "template": {
                "metadata": {"labels": _labels(policy, options)},
                "spec": job_spec(policy, policy_text, options, uid_label=JOBSET_UID_LABEL),
            },
        }
    ]
    if has_control_job(policy):
        replicated_jobs.append(_control_replicated_job(policy, policy_text, options))
    metadata = _meta(jobset_name, policy, options)
    if options.exclusive_topology is not None:
        metadata["annotations"] = {podextras.EXCLUSIVE_TOPOLOGY: options.exclusive_topology}
    obj = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "network": {
                "enableDNSHostnames": True,
                "subdomain": policy.service,
                "publishNotReadyAddresses": True,
            },
            "failurePolicy": jobset_failure_policy(),
            "replicatedJobs": replicated_jobs,
        },
    }
    return _workload(obj, options)


def jobset_failure_policy() -> dict[str, Any]:
    """No restart of the whole JobSet, and a Job failed by its pod failure policy (exit 2 or 4)
    fails the JobSet."""
    return {
        "maxRestarts": 0,
        "rules": [
            {
                "name": "nvtrainNeverRetry",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
            }
        ],
    }


def runtime(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """The Kubeflow Trainer v2 runtime (``--trainer-runtime``) around the training Job's spec:
    see ``nvtrain.templates.trainer_runtime``."""
    assert options.trainer_runtime is not None
    exclusive = options.exclusive_topology
    return trainer_runtime.runtime(
        scope=options.trainer_runtime,
        metadata=_meta(policy.job.name, policy, options),
        nodes=policy.rendezvous.nodes,
        job_spec=job_spec(policy, policy_text, options, uid_label=JOBSET_UID_LABEL),
        job_labels=_labels(policy, options),
        container=CONTAINER,
        failure_policy=jobset_failure_policy(),
        annotations={podextras.EXCLUSIVE_TOPOLOGY: exclusive} if exclusive is not None else {},
        ttl=options.ttl,
    )


def _check_size(policy_text: str, source: str) -> None:
    size = len(policy_text.encode("utf-8"))
    if size > CONFIGMAP_LIMIT:
        raise UsageError(
            f"{source} is {size:,} bytes, more than a ConfigMap holds (Kubernetes' limit is 1 MiB, "
            f"{CONFIGMAP_LIMIT:,} bytes)",
            "remove what the policy does not need (long comments, huge args); a policy is a few KiB",
        )


def render(policy: Policy, policy_text: str, options: ManifestOptions | None = None) -> list[dict[str, Any]]:
    """Every object for ``policy`` (whose file text is ``policy_text``), in apply order."""
    options = options or ManifestOptions()
    _check_size(policy_text, "the policy file")
    _check(policy, options)
    control = has_control_job(policy)
    objects = [configmap(policy, policy_text, options)]
    # JobSet makes the headless Service (for the Trainer runtime, one per TrainJob).
    objects += [] if options.jobset or options.trainer_runtime else [service(policy, options)]
    objects.append(network_policy(policy, options))
    if options.pod_monitor:
        metadata = _meta(policy.job.name, policy, options)
        objects.append(monitoring.pod_monitor(metadata=metadata, selector=selector(policy)))
    if options.monitoring_rules:
        objects.append(alerts.prometheus_rule(policy, _meta(f"{policy.job.name}-alerts", policy, options)))
        objects.append(
            alerts.dashboard_configmap(policy, _meta(f"{policy.job.name}-dashboard", policy, options))
        )
    workloads: list[dict[str, Any]] = []
    if options.trainer_runtime is not None:
        workloads.append(runtime(policy, policy_text, options))
    elif options.jobset:
        workloads.append(jobset(policy, policy_text, options))
    else:
        if control:
            # Before the workers: their launchers wait for the control pod's name to resolve.
            workloads.append(control_job(policy, policy_text, options))
        workloads.append(job(policy, policy_text, options))
    if options.scheduler_name == scheduling.VOLCANO:
        # Before the pods that name it; every pod of the job, the control pod too, and what
        # they request together.
        members = [pods for w in workloads for pods in scheduling.pod_templates(w)]
        objects.append(
            scheduling.pod_group(
                metadata=_meta(policy.job.name, policy, options),
                min_member=policy.rendezvous.nodes + (1 if control else 0),
                queue=options.queue,
                priority_class=options.priority_class,
                min_resources=scheduling.min_resources(members),
            )
        )
    return objects + workloads


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as literal blocks, for a readable policy in the
    ConfigMap. PyYAML itself falls back to a quoted scalar where a block cannot hold the text
    (e.g. trailing spaces, control characters); the tests check that every string survives."""


_LINE_BREAKS = frozenset("\r\x85\u2028\u2029\ufeff")
"""Characters that YAML reads as line breaks (or, the BOM, drops). PyYAML writes some of them
raw into plain, single-quoted and block scalars, where they come back as a newline or a
space (NEL, ``\x85``, does); a double-quoted scalar escapes them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if _LINE_BREAKS.intersection(value):
        style: str | None = '"'
    elif "\n" in value:
        style = "|"
    else:
        style = None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)

HEADER = (
    "# Rendered by `nvtrain manifest` from the policy in the ConfigMap below.\n"
    "# Change the policy and render again rather than editing this file.\n"
)


def dump(objects: list[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML text (quoting by PyYAML, keys in build order)."""
    body = yaml.dump_all(
        objects,
        Dumper=_Dumper,
        sort_keys=False,
        explicit_start=True,
        allow_unicode=True,
        width=100,
    )
    return HEADER + body


def notes(policy: Policy, options: ManifestOptions) -> list[str]:
    """What the user should know about the memory of the pods (``nvtrain manifest`` prints each
    on stderr): the host copies are kept but not sized (no ``--state-per-rank``), or
    ``--state-per-rank`` is given for a policy that keeps none; CPU or memory is not requested
    because the ranks of a pod are not known. Call after ``render``."""
    found = _host_copy_notes(policy, options)
    given = {"--cpu": ("CPU", options.cpu), "--memory": ("memory", options.memory)}
    missing = [flag for flag, (_, value) in given.items() if value is None]
    if _known_ranks(policy, options) is None and missing:
        found.append(
            f'[job] nproc_per_node = "{policy.job.nproc_per_node}" does not say how many ranks a pod '
            f"runs, so no {' and no '.join(given[f][0] for f in missing)} "
            "is requested by default: the pods may be evicted first, and nothing reserves the memory "
            f"of /dev/shm; pass {' and '.join(missing)}"
        )
    return found


def _host_copy_notes(policy: Policy, options: ManifestOptions) -> list[str]:
    """The notes on the host copies of the checkpoint (see ``notes``)."""
    c = policy.checkpoint
    if not keeps_host_copy(policy):
        if options.state_per_rank is None:
            return []
        reason = (
            "async = false" if not c.async_ else "in_memory = false" if not c.in_memory else 'memory_dir = ""'
        )
        return [
            f"--state-per-rank changes nothing: the policy keeps no host copy of the checkpoint "
            f"([checkpoint] {reason})"
        ]
    if options.state_per_rank is not None:
        return []
    ranks = _known_ranks(policy, options)
    per_rank = f"{host_copies_per_rank(policy)} × state per rank"
    per_pod = (
        f"{per_rank} × {ranks} ranks per pod" if ranks is not None else f"{per_rank}, each rank of a pod"
    )
    where = (
        f"[checkpoint] memory_dir {c.memory_dir!r} holds the host copies of the checkpoint, {per_pod} "
        f"(per rank {_host_copies_made_of(policy)})"
    )
    size_it = "pass --state-per-rank QUANTITY (one rank's model + optimizer state)"
    if _in_shm(c.memory_dir):
        return [
            f"{where}; /dev/shm is sized {options.shm_size} (--shm-size) without them: {size_it} to size it"
        ]
    return [f"{where}; no memory-backed volume is mounted there: {size_it} to mount one"]


@dataclasses.dataclass(frozen=True)
class Rendered:
    """The objects of one policy, their YAML text, and ``notes`` for the user."""

    objects: list[dict[str, Any]]
    text: str
    notes: tuple[str, ...] = ()

    def summary(self) -> list[tuple[str, str]]:
        """(kind, name) of every object, in apply order."""
        return [(str(o["kind"]), str(o["metadata"]["name"])) for o in self.objects]


def manifest_from_file(path: Path, options: ManifestOptions | None = None) -> Rendered:
    """Read and validate the policy at ``path``, then render its manifests.

    Raises ``ConfigError`` when the policy has errors (NVRx-version rules only with
    ``options.nvrx_version``; otherwise they are left to ``nvtrain validate --nvrx``) and
    ``UsageError`` when the options cannot be rendered."""
    from nvtrain.config.load import read_source
    from nvtrain.config.validation import validate_source

    raw, problem = read_source(path)
    if raw is None:
        assert problem is not None
        raise ConfigError(str(path), [problem])
    wanted = options.nvrx_version if options is not None else None
    nvrx = parse_nvrx_option(wanted) if wanted is not None else None
    result = validate_source(raw, str(path), nvrx=nvrx)
    if result.policy is None or result.errors:
        raise ConfigError(result.source, result.findings)
    text = raw.decode("utf-8")
    _check_size(text, f"the policy file {path}")
    objects = render(result.policy, text, options)
    return Rendered(objects, dump(objects), tuple(notes(result.policy, options or ManifestOptions())))

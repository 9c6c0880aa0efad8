"""The options of ``nvtrain manifest``, declared once: ``ManifestOptions``.

Each field is what the manifests need that the policy does not say (the cluster side of the
job), with a docstring for the library and, in its metadata, a ``Flag``: the option's name,
metavar, ``--help`` text and help panel, and how its command-line values become the field's
value (``parse``). ``nvtrain.cli.manifest`` builds the command's options from these, in field
order (the order ``--help`` lists them), and ``from_flags`` turns what it was given into
``ManifestOptions``; neither the names nor the help texts are written anywhere else.

Also here, what the options alone decide: the Kubernetes version the manifests are for
(``kubernetes_version``, ``per_index``), the Jobs' ``backoffLimit`` and which resources are RDMA
devices. Only the standard library and ``nvtrain.errors`` are imported: the command line of
``nvtrain`` imports this module at start-up.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from nvtrain.errors import UsageError

__all__ = [
    "INT32_MAX",
    "OLDEST_KUBERNETES",
    "PER_INDEX_SINCE",
    "PLATFORM_PANEL",
    "POD_PANEL",
    "Flag",
    "ManifestOptions",
    "backoff_limit_total",
    "flag_of",
    "is_rdma_resource",
    "kubernetes_version",
    "per_index",
    "rdma_flags",
]

POD_PANEL = "Pod"
"""Help panel of what each pod gets: resources, memory, storage, environment, extras."""
PLATFORM_PANEL = "Scheduling and security"
"""Help panel of how the cluster places, admits, secures and watches the pods."""

Parse = Literal["value", "pairs", "counts", "list", "yaml", "yaml-list"]
"""How the command-line values of a ``Flag`` become its field's value: ``value`` as given;
``pairs`` (repeatable ``KEY=VALUE``) a mapping; ``counts`` (repeatable ``NAME=COUNT``) a mapping
of whole numbers; ``list`` (repeatable) a tuple; ``yaml`` (a file) its YAML document;
``yaml-list`` (repeatable files) the documents, a file holding a list giving each item."""


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a field of ``ManifestOptions`` is given on the command line of ``nvtrain manifest``."""

    name: str
    """``--image``."""
    help: str
    """One line of ``--help``."""
    metavar: str | None = None
    """``IMAGE``; None for a switch (a bool field)."""
    panel: str | None = None
    """The help panel (``POD_PANEL``, ``PLATFORM_PANEL``), or None for the command's own."""
    parse: Parse = "value"


def _flag(
    name: str, metavar: str | None, help: str, *, panel: str | None = None, parse: Parse = "value"
) -> dict[str, Flag]:
    """The metadata of a field given by the option ``name``."""
    return {"flag": Flag(name, help, metavar, panel, parse)}


def flag_of(field: dataclasses.Field[Any]) -> Flag:
    """The ``Flag`` of a field of ``ManifestOptions``."""
    found = field.metadata["flag"]
    assert isinstance(found, Flag)
    return found


@dataclasses.dataclass(frozen=True, kw_only=True)
class ManifestOptions:
    """What the manifests need that the policy does not say: the cluster side of the job.

    Fields are in the order ``nvtrain manifest --help`` lists their options."""

    image: str | None = dataclasses.field(
        default=None, metadata=_flag("--image", "IMAGE", "Training image (default: <job name>:latest).")
    )
    """Training image (built from the starter Dockerfile). Default: ``<job name>:latest``."""
    nvrx_version: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--nvrx",
            "VERSION",
            "NVRx version in the image (its Dockerfile's NVRX_VERSION): the policy is checked "
            "against it, and the pods record it for `nvtrain validate --manifest`.",
        ),
    )
    """NVRx version of the training image (``"0.7.0"``): ``manifest_from_file`` checks the policy
    against it, and the training pods record it in the annotation ``nvtrain.dev/nvrx-version``
    for ``nvtrain validate --manifest`` (``nvtrain.kube.nvrx_pin``). None: neither."""
    gpus_per_node: int | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--gpus",
            "N",
            "GPUs per pod (default: nproc_per_node of the policy; 0 with gloo).",
            panel=POD_PANEL,
        ),
    )
    """``nvidia.com/gpu`` per pod. Default: ``[job] nproc_per_node`` when it is a number and
    the backend is not gloo; 0 for gloo or ``"cpu"``; ``"gpu"`` needs it given."""
    efa: int = dataclasses.field(
        default=0, metadata=_flag("--efa", "N", "AWS EFA devices per pod.", panel=POD_PANEL)
    )
    """``vpc.amazonaws.com/efa`` devices per pod (AWS); adds the IPC_LOCK capability."""
    resources: Mapping[str, int] = dataclasses.field(
        default_factory=dict,
        metadata=_flag(
            "--resource",
            "NAME=COUNT",
            "Another extended resource per pod, e.g. nvidia.com/mig-3g.40gb=1 (repeatable); "
            "names holding rdma or hca (rdma/hca_shared_devices_a=1) are RDMA devices (IPC_LOCK).",
            panel=POD_PANEL,
            parse="counts",
        ),
    )
    """Other extended resources per pod, e.g. ``{"nvidia.com/mig-3g.40gb": 1}`` or
    ``{"rdma/hca_shared_devices_a": 1}``. Only those whose name says RDMA (``is_rdma_resource``)
    add the IPC_LOCK capability; ``nvidia.com/gpu`` and ``vpc.amazonaws.com/efa`` are refused
    (``--gpus`` and ``--efa`` set them)."""
    rdma_resources: Mapping[str, int] = dataclasses.field(
        default_factory=dict,
        metadata=_flag(
            "--rdma-resource",
            "NAME=COUNT",
            "An extended resource per pod that is an RDMA device whatever its name: the "
            "training container gets IPC_LOCK (repeatable).",
            panel=POD_PANEL,
            parse="counts",
        ),
    )
    """Extended resources per pod that are RDMA devices whatever their name (``--rdma-resource``):
    each adds the IPC_LOCK capability, as ``efa`` does."""
    cpu: str | None = dataclasses.field(
        default=None,
        metadata=_flag("--cpu", "QUANTITY", "CPU request (default: 2 per rank).", panel=POD_PANEL),
    )
    """CPU request (a Kubernetes quantity such as ``"90"`` or ``"500m"``)."""
    memory: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--memory",
            "QUANTITY",
            "Memory request and limit (default: 16Gi per rank + /dev/shm + host copies).",
            panel=POD_PANEL,
        ),
    )
    """Memory request and limit (a quantity such as ``"900Gi"``)."""
    qos: str = dataclasses.field(
        default="burstable",
        metadata=_flag(
            "--qos",
            "CLASS",
            "burstable (no CPU limit) or guaranteed (every limit equal to its request).",
            panel=POD_PANEL,
        ),
    )
    """``"burstable"``: CPU and memory requested (by default sized from the ranks of a pod), the
    memory limit equal to its request, no CPU limit; ``"guaranteed"``: every limit equal to its
    request. See ``nvtrain.kube.qos``."""
    shm_size: str = dataclasses.field(
        default="16Gi",
        metadata=_flag("--shm-size", "QUANTITY", "Size of /dev/shm (memory).", panel=POD_PANEL),
    )
    """Size of the memory-backed ``/dev/shm`` (data-loader workers pass batches through it)."""
    state_per_rank: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--state-per-rank",
            "QUANTITY",
            "Checkpoint state (model + optimizer) of one rank: adds memory for the host "
            "copies per rank that [checkpoint] memory_dir keeps (2, or 3 with peer_copy and 2+ pods).",
            panel=POD_PANEL,
        ),
    )
    """Checkpoint state (model + optimizer shard) of one rank, a quantity such as ``"20Gi"``.
    When the policy keeps host copies (``sizing.keeps_host_copy``), ``host_copies_per_rank`` ×
    this × the ranks of a pod is added to ``/dev/shm`` (``memory_dir`` in it) or mounted as a
    memory-backed emptyDir at ``memory_dir``. Unset: the sizes stay as they are and
    ``sizing.notes`` says so."""
    checkpoint_pvc: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--checkpoint-pvc",
            "NAME",
            "ReadWriteMany claim mounted at the checkpoint dir (default: <job name>-checkpoints).",
            panel=POD_PANEL,
        ),
    )
    """PersistentVolumeClaim (ReadWriteMany) mounted at ``[checkpoint] dir`` on every pod.
    Default: ``<job name>-checkpoints``."""
    env: Mapping[str, str] = dataclasses.field(
        default_factory=dict,
        metadata=_flag(
            "--env", "NAME=VALUE", "Extra environment variable (repeatable).", panel=POD_PANEL, parse="pairs"
        ),
    )
    """Extra environment variables of the training container (e.g. NCCL settings)."""
    node_selector: Mapping[str, str] = dataclasses.field(
        default_factory=dict,
        metadata=_flag(
            "--node-selector",
            "KEY=VALUE",
            "Node label the pods need (repeatable).",
            panel=POD_PANEL,
            parse="pairs",
        ),
    )
    """Node labels the training pods must run on (``nodeSelector``). Not the control pod's: it
    needs no GPU node."""
    labels: Mapping[str, str] = dataclasses.field(
        default_factory=dict,
        metadata=_flag("--label", "KEY=VALUE", "Extra label on every object (repeatable).", parse="pairs"),
    )
    """Extra labels on every object and pod."""
    annotations: Mapping[str, str] = dataclasses.field(
        default_factory=dict,
        metadata=_flag(
            "--annotation",
            "KEY=VALUE",
            "Extra annotation on every pod (repeatable).",
            panel=PLATFORM_PANEL,
            parse="pairs",
        ),
    )
    """Extra annotations on every pod."""
    tolerations: Sequence[str] = dataclasses.field(
        default=(),
        metadata=_flag(
            "--toleration",
            "KEY[=VALUE]:EFFECT",
            "Toleration of every pod, e.g. dedicated=ml:NoSchedule (repeatable).",
            panel=PLATFORM_PANEL,
            parse="list",
        ),
    )
    """Tolerations of every pod, each ``KEY[=VALUE]:EFFECT``."""
    priority_class: str | None = dataclasses.field(
        default=None,
        metadata=_flag("--priority-class", "NAME", "PriorityClass of the pods.", panel=PLATFORM_PANEL),
    )
    """``priorityClassName`` of every pod."""
    scheduler_name: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--scheduler-name",
            "NAME",
            "Scheduler of the pods; volcano also renders a PodGroup of every pod.",
            panel=PLATFORM_PANEL,
        ),
    )
    """``schedulerName`` of every pod; ``"volcano"`` also renders a Volcano PodGroup."""
    queue: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--queue",
            "NAME",
            "Kueue LocalQueue (or, with --scheduler-name volcano, Volcano queue).",
            panel=PLATFORM_PANEL,
        ),
    )
    """Kueue LocalQueue of the workload, or the Volcano queue with ``scheduler_name = "volcano"``."""
    service_account: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--service-account",
            "NAME",
            "ServiceAccount of the pods (its API token stays unmounted).",
            panel=PLATFORM_PANEL,
        ),
    )
    """``serviceAccountName`` of every pod (its API token stays unmounted)."""
    pod_security: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--pod-security",
            "LEVEL",
            "Pod Security Standards level the pods pass: baseline or restricted.",
            panel=PLATFORM_PANEL,
        ),
    )
    """Pod Security Standards level every pod must pass, ``"baseline"`` or ``"restricted"``
    (``nvtrain.kube.podsecurity``); None renders no security context but IPC_LOCK for RDMA."""
    run_as_user: int | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--run-as-user",
            "UID",
            "User and group of the pods (default with --pod-security restricted: 1000).",
            panel=PLATFORM_PANEL,
        ),
    )
    """User and group id of every pod. Default: 1000 with ``pod_security = "restricted"``,
    otherwise the image's user."""
    ttl: int | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--ttl",
            "SECONDS",
            "Delete the finished Jobs (or JobSet) after SECONDS (ttlSecondsAfterFinished).",
            panel=PLATFORM_PANEL,
        ),
    )
    """``ttlSecondsAfterFinished`` of the Jobs (or the JobSet): deleted that long after they end."""
    pod_monitor: bool = dataclasses.field(
        default=False,
        metadata=_flag(
            "--pod-monitor",
            None,
            "Also render a Prometheus Operator PodMonitor (needs [metrics] enabled).",
            panel=PLATFORM_PANEL,
        ),
    )
    """Also render a Prometheus Operator PodMonitor for the metrics port (needs ``[metrics]``)."""
    metrics_from: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--metrics-from",
            "NAMESPACE",
            "Namespace of the Prometheus that scrapes the metrics port: the NetworkPolicy admits "
            "that port only from its pods (default: from every source).",
            panel=PLATFORM_PANEL,
        ),
    )
    """Namespace of the Prometheus that scrapes the metrics port (``--metrics-from``): the
    NetworkPolicy admits that port only from pods of this namespace. None: from every source."""
    backoff_limit: int = dataclasses.field(
        default=6,
        metadata=_flag(
            "--backoff-limit",
            "N",
            "Failures retried per pod (never exit 2 or 4); the Job's backoffLimit is N x pods.",
        ),
    )
    """Failures of each pod (each index) that the Job retries (exit codes other than 2 and 4)
    before it fails: the Job's ``backoffLimit`` is this × the pods (``backoff_limit_total``), so
    that one wave of failures of every pod (DNS not ready, a node pool restarted) does not fail a
    large job; with ``kubernetes`` 1.33 or later also ``backoffLimitPerIndex``."""
    kubernetes: str = dataclasses.field(
        default="1.28",
        metadata=_flag(
            "--kubernetes",
            "VERSION",
            "Oldest Kubernetes version of the target clusters (MAJOR.MINOR); from 1.33 the "
            "Job also gets backoffLimitPerIndex.",
        ),
    )
    """Oldest Kubernetes version (``MAJOR.MINOR``) of the clusters the manifest is for. From
    ``PER_INDEX_SINCE`` (1.33, where ``backoffLimitPerIndex`` is GA) the training Job also gets
    ``backoffLimitPerIndex`` and ``maxFailedIndexes: 0``."""
    jobset: bool = dataclasses.field(
        default=False,
        metadata=_flag("--jobset", None, "Render a JobSet (jobset.x-k8s.io/v1alpha2) instead of the Job."),
    )
    """Render a JobSet instead of the Job (and let JobSet create the headless Service)."""
    monitoring_rules: bool = dataclasses.field(
        default=False,
        metadata=_flag(
            "--monitoring-rules",
            None,
            "Also render Prometheus alerts (a PrometheusRule) and a Grafana dashboard (a ConfigMap "
            "labelled grafana_dashboard) for the job's metrics; needs [metrics] enabled = true.",
            panel=PLATFORM_PANEL,
        ),
    )
    """Also render the job's Prometheus alerts (a PrometheusRule) and a Grafana dashboard (a
    ConfigMap); needs ``[metrics]``. See ``nvtrain.kube.alerts``."""
    trainer_runtime: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--trainer-runtime",
            "SCOPE",
            "Render a Kubeflow Trainer v2 runtime instead of the Job: cluster "
            "(ClusterTrainingRuntime) or namespaced (TrainingRuntime); TrainJobs name it in runtimeRef.",
        ),
    )
    """``"cluster"``: render a Kubeflow Trainer v2 ``ClusterTrainingRuntime`` instead of the
    Job (and no Service: JobSet makes it); ``"namespaced"``: a ``TrainingRuntime`` in
    ``[rendezvous] namespace``. See ``nvtrain.kube.trainer_runtime``."""
    secret_env: Sequence[str] = dataclasses.field(
        default=(),
        metadata=_flag(
            "--secret-env",
            "SECRET",
            "Every key of this Secret as an environment variable of the training container (repeatable).",
            panel=POD_PANEL,
            parse="list",
        ),
    )
    """Secrets whose keys become environment variables of the training container (``envFrom``)."""
    volumes: Sequence[str] = dataclasses.field(
        default=(),
        metadata=_flag(
            "--volume",
            "KIND:NAME:PATH[:ro]",
            "Mount a pvc, secret or configmap at PATH in the training container (repeatable).",
            panel=POD_PANEL,
            parse="list",
        ),
    )
    """Extra volumes of the training container, each ``KIND:NAME:PATH[:ro]`` with KIND ``pvc``,
    ``secret`` or ``configmap`` (``podextras.extra_volume``)."""
    init_containers: Sequence[Mapping[str, Any]] = dataclasses.field(
        default=(),
        metadata=_flag(
            "--init-container",
            "FILE",
            "YAML file with an init container of the training pods, or a list of them (repeatable).",
            panel=POD_PANEL,
            parse="yaml-list",
        ),
    )
    """Init containers of the training pods, as in a pod spec (each with a name and an image)."""
    affinity: Mapping[str, Any] | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--affinity",
            "FILE",
            "YAML file with the training pods' affinity (nodeAffinity, podAffinity, podAntiAffinity).",
            panel=PLATFORM_PANEL,
            parse="yaml",
        ),
    )
    """``affinity`` of the training pods (``nodeAffinity``, ``podAffinity``, ``podAntiAffinity``)."""
    exclusive_topology: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--exclusive-topology",
            "NODE_LABEL",
            "JobSet exclusive placement: the job's pods alone in one domain of NODE_LABEL "
            "(--jobset or --trainer-runtime).",
            panel=PLATFORM_PANEL,
        ),
    )
    """Node label of the JobSet's exclusive placement (``--jobset`` or ``trainer_runtime``):
    the annotation ``alpha.jobset.sigs.k8s.io/exclusive-topology``."""
    required_topology: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--required-topology",
            "NODE_LABEL",
            "Kueue Topology Aware Scheduling: the training pods only in one domain of NODE_LABEL.",
            panel=PLATFORM_PANEL,
        ),
    )
    """Kueue Topology Aware Scheduling: the training pods only inside one domain of this node
    label (``kueue.x-k8s.io/podset-required-topology``)."""
    preferred_topology: str | None = dataclasses.field(
        default=None,
        metadata=_flag(
            "--preferred-topology",
            "NODE_LABEL",
            "Kueue Topology Aware Scheduling: the training pods in one domain of NODE_LABEL, if they fit.",
            panel=PLATFORM_PANEL,
        ),
    )
    """As ``required_topology``, as far as possible (``kueue.x-k8s.io/podset-preferred-topology``)."""

    @classmethod
    def from_flags(cls, given: Mapping[str, Any], read_yaml: Callable[[str, Path], Any]) -> ManifestOptions:
        """The options from the values of their flags as the command line gives them (keyed by
        field name; a repeatable flag's list, or None when it is not given), each turned into
        its field's value as its ``Flag.parse`` says; ``read_yaml(flag, path)`` reads a file's
        YAML document. ``UsageError`` names the flag of a value that cannot be turned."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if field.name in given:
                values[field.name] = _parse(flag_of(field), given[field.name], read_yaml)
        return cls(**values)


def _parse(flag: Flag, value: Any, read_yaml: Callable[[str, Path], Any]) -> Any:
    if flag.parse == "pairs":
        return _pairs(flag.name, value)
    if flag.parse == "counts":
        return _counts(flag.name, value)
    if flag.parse == "list":
        return tuple(value or ())
    if flag.parse == "yaml":
        return read_yaml(flag.name, value) if value is not None else None
    if flag.parse == "yaml-list":
        found: list[Any] = []
        for path in value or []:
            data = read_yaml(flag.name, path)
            found += data if isinstance(data, list) else [data]
        return tuple(found)
    return value


def _pairs(flag: str, items: Sequence[str] | None) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r} is not KEY=VALUE", f"write e.g. {flag} name=value")
        pairs[key] = value
    return pairs


def _counts(flag: str, items: Sequence[str] | None) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key, value in _pairs(flag, items).items():
        if not value.isdigit():
            raise UsageError(
                f"{flag} {key}={value!r}: the count is not a whole number", f"e.g. {flag} {key}=1"
            )
        counts[key] = int(value)
    return counts


# -- what the options alone decide -------------------------------------------------------------------

INT32_MAX = 2**31 - 1
"""Kubernetes' ``backoffLimit`` is an int32; device counts beyond it are never meant either."""

OLDEST_KUBERNETES = (1, 28)
"""The oldest Kubernetes the manifests work on (Indexed Jobs, pod failure policy, the
``batch.kubernetes.io/controller-uid`` label)."""

PER_INDEX_SINCE = (1, 33)
"""Kubernetes version from which the training Job gets ``backoffLimitPerIndex``: GA there (beta,
on by default, since 1.29; a cluster may have turned it off before 1.33)."""


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
    return min(options.backoff_limit * pods, INT32_MAX)

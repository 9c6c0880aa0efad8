"""The Kubernetes objects of a policy, as plain dicts built by pure functions: the policy
ConfigMap, the headless Service, the NetworkPolicy, the training pod template and its Indexed
Job, and the control Job of ``[rendezvous] store = "control"``.

Also the names and numbers these objects share with the checks of ``nvtrain validate
--manifest``: container names, mount paths, labels, the grace period, the exit codes that never
retry. Every value that the policy holds is taken from it; the cluster side comes from
``ManifestOptions``, the sizes from ``sizing``. The JobSet and the Trainer runtime around the same
Job spec are built in ``jobset``; ``manifest.render`` puts everything together.
"""

from __future__ import annotations

import copy
import hashlib
import math
from typing import Any

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode
from nvtrain.kube import monitoring, podextras, podsecurity, qos, scheduling
from nvtrain.kube.nvrx_pin import NVRX_ANNOTATION, parse_nvrx_option
from nvtrain.kube.options import ManifestOptions, backoff_limit_total, per_index, rdma_flags
from nvtrain.kube.sizing import (
    GPU_RESOURCE,
    SHM_MOUNT,
    gpus,
    host_copy_volume_size,
    shm_size_limit,
    training_resources,
)
from nvtrain.kubenames import control_hostname

__all__ = [
    "COMPONENT_LABEL",
    "CONTAINER",
    "CONTROL_CONTAINER",
    "CONTROL_RESOURCES",
    "GRACE_MARGIN",
    "HOST_COPY_VOLUME",
    "INDEX_ANNOTATION",
    "JOBSET_UID_LABEL",
    "JOB_UID_LABEL",
    "NEVER_RETRY",
    "POLICY_FILE",
    "POLICY_MOUNT",
    "configmap",
    "control_job",
    "control_job_name",
    "control_job_spec",
    "finish_workload",
    "grace_period",
    "has_control_job",
    "image_of",
    "job",
    "job_spec",
    "network_policy",
    "object_labels",
    "object_meta",
    "pod_failure_policy",
    "pod_template",
    "policy_configmap_name",
    "pvc_of",
    "selector",
    "service",
    "training_env",
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

NEVER_RETRY = (int(ExitCode.USAGE), int(ExitCode.ESCALATED))
"""Exit codes that fail the Job at once: an invalid policy (2) and escalation (4)."""

JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"

JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

HOST_COPY_VOLUME = "hostcopy"
"""The memory-backed emptyDir mounted at a ``memory_dir`` outside ``/dev/shm``."""


def grace_period(policy: Policy) -> int:
    """``terminationGracePeriodSeconds``: ``[job] stop_timeout`` plus ``GRACE_MARGIN``."""
    return math.ceil(policy.job.stop_timeout) + GRACE_MARGIN


def selector(policy: Policy) -> dict[str, str]:
    """Labels that pick exactly the pods of this job (Service, NetworkPolicy)."""
    return {"app.kubernetes.io/name": "nvtrain", "app.kubernetes.io/instance": policy.job.name}


def object_labels(
    policy: Policy, options: ManifestOptions, *, component: str | None = None
) -> dict[str, str]:
    """The labels of every object and pod: the selector, ``managed-by``, the ``component``
    (``control`` for the control Job and its pod), then ``--label``."""
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
    return control_hostname(policy.job.name)


def object_meta(name: str, policy: Policy, options: ManifestOptions) -> dict[str, Any]:
    """``metadata`` of an object named ``name`` in ``[rendezvous] namespace``, with ``object_labels``."""
    return {"name": name, "namespace": policy.rendezvous.namespace, "labels": object_labels(policy, options)}


def policy_configmap_name(policy: Policy, policy_text: str) -> str:
    """``<job>-policy-<hash>``: the policy ConfigMap, named after a hash of its text."""
    digest = hashlib.sha256(policy_text.encode("utf-8")).hexdigest()[:10]
    return f"{policy.job.name}-policy-{digest}"


def configmap(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """The policy file, as one string value, in an immutable ConfigMap."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(policy_configmap_name(policy, policy_text), policy, options),
        "immutable": True,
        "data": {POLICY_FILE: policy_text},
    }


def service(policy: Policy, options: ManifestOptions) -> dict[str, Any]:
    """The headless Service behind the pods' DNS names; not-ready pods are published too,
    since peers must find each other before any pod is ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(policy.service, policy, options),
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
        "metadata": object_meta(f"{policy.job.name}-peers", policy, options),
        "spec": {
            "podSelector": {"matchLabels": selector(policy)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def image_of(policy: Policy, options: ManifestOptions) -> str:
    """``--image``, or ``<job name>:latest``."""
    return options.image if options.image is not None else f"{policy.job.name}:latest"


def pvc_of(policy: Policy, options: ManifestOptions) -> str:
    """``--checkpoint-pvc``, or ``<job name>-checkpoints``."""
    return options.checkpoint_pvc or f"{policy.job.name}-checkpoints"


def _rdma(options: ManifestOptions) -> bool:
    return bool(rdma_flags(options))


def training_env(
    policy: Policy, options: ManifestOptions, *, uid_label: str, extra: bool = True
) -> list[Any]:
    """The training container's environment: pod IP, completion index, run id (from the
    workload's UID label ``uid_label``), the NVRx in-process settings, then ``--env`` (with ``extra``)."""
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


def pod_template(
    policy: Policy, policy_text: str, options: ManifestOptions, *, uid_label: str
) -> dict[str, Any]:
    """The pod: ``nvtrain run`` on the mounted policy, with identity, storage and resources."""
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image_of(policy, options),
        "imagePullPolicy": scheduling.pull_policy(image_of(policy, options)),
        "command": ["nvtrain", "run", f"{POLICY_MOUNT}/{POLICY_FILE}"],
        "env": training_env(policy, options, uid_label=uid_label),
        "ports": [{"name": "rendezvous", "containerPort": policy.rendezvous.port, "protocol": "TCP"}],
    }
    metadata: dict[str, Any] = {"labels": object_labels(policy, options)}
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
    resources = training_resources(policy, options)
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
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": pvc_of(policy, options)}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size_limit(policy, options)}},
        ],
    }
    host_copy = host_copy_volume_size(policy, options)
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


def finish_workload(obj: dict[str, Any], options: ManifestOptions) -> dict[str, Any]:
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
        "metadata": object_meta(policy.job.name, policy, options),
        "spec": job_spec(policy, policy_text, options, uid_label=JOB_UID_LABEL),
    }
    return finish_workload(obj, options)


def control_job(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """The Job of the control pod ``<job>-control`` (``[rendezvous] store = "control"``): it runs
    ``nvtrain control`` on the mounted policy, the rendezvous store that every training pod dials
    at ``<job>-control.<service>...``. One small CPU pod: no GPUs, no checkpoint volume, no
    ``/dev/shm``, and neither the GPU toleration nor ``--node-selector`` (they are the training
    pods'). It keeps the Service's selector labels, so the headless Service gives it its DNS name
    and the NetworkPolicy admits only the job's pods to it."""
    metadata = object_meta(control_job_name(policy), policy, options)
    metadata["labels"] = object_labels(policy, options, component="control")
    obj = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": control_job_spec(policy, policy_text, options),
    }
    return finish_workload(obj, options)


def control_job_spec(policy: Policy, policy_text: str, options: ManifestOptions) -> dict[str, Any]:
    """The spec of the control Job (``control_job``), also the control replicated Job of the JobSet."""
    port = policy.rendezvous.port
    container: dict[str, Any] = {
        "name": CONTROL_CONTAINER,
        "image": image_of(policy, options),
        "imagePullPolicy": scheduling.pull_policy(image_of(policy, options)),
        "command": ["nvtrain", "control", f"{POLICY_MOUNT}/{POLICY_FILE}"],
        "env": [_field_env("POD_IP", "status.podIP"), {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "rendezvous", "containerPort": port, "protocol": "TCP"}],
        "resources": qos.control_resources(options.qos, CONTROL_RESOURCES),
        "volumeMounts": [{"name": "policy", "mountPath": POLICY_MOUNT, "readOnly": True}],
    }
    pod = {
        "metadata": {"labels": object_labels(policy, options, component="control")},
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

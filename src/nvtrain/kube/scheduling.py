"""Where and when the pods run: tolerations, priority, scheduler, queue, service account, TTL.

- ``--toleration KEY[=VALUE]:EFFECT`` (repeatable): a toleration on every pod, beside the one
  for the ``nvidia.com/gpu`` taint that GPU pods get anyway;
- ``--priority-class``, ``--scheduler-name``, ``--service-account``: the pod fields of the same
  names (``priorityClassName``, ``schedulerName``, ``serviceAccountName``);
- ``--ttl SECONDS``: ``ttlSecondsAfterFinished`` of the Jobs (or the JobSet);
- ``--queue NAME``: the Kueue LocalQueue (label ``kueue.x-k8s.io/queue-name`` on the workload),
  or with ``--scheduler-name volcano`` the Volcano queue of the job's PodGroup;
- ``--scheduler-name volcano``: a Volcano ``PodGroup`` holding every pod of the job (control
  pod included), named on each pod by the ``scheduling.k8s.io/group-name`` annotation, so that
  Volcano starts all of them or none.

Also ``pull_policy``: ``Always`` for an image without a tag or tagged ``latest``, as Kubernetes
would default it, so that a pod never runs a stale ``latest`` that a node pulled long ago.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from fractions import Fraction
from typing import Any

from nvtrain.errors import UsageError
from nvtrain.kube.quantity import format_bytes, format_cpu, parse_quantity
from nvtrain.kubenames import LABEL_VALUE, check_dns_subdomain, check_qualified_name

__all__ = [
    "EFFECTS",
    "GROUP_ANNOTATION",
    "QUEUE_LABEL",
    "VOLCANO",
    "check_annotations",
    "check_queue",
    "check_scheduling",
    "min_resources",
    "pod_group",
    "pod_templates",
    "pull_policy",
    "toleration",
]

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
"""Taint effects a ``--toleration`` may name."""

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The label by which Kueue puts a Job or JobSet into a LocalQueue."""

VOLCANO = "volcano"
"""The scheduler name of Volcano: ``--scheduler-name volcano`` renders the PodGroup."""

GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
"""The pod annotation that names a pod's Volcano PodGroup."""

_INT32_MAX = 2**31 - 1


def toleration(spec: str) -> dict[str, str]:
    """The toleration of ``--toleration spec``: ``KEY:EFFECT`` tolerates the taint ``KEY``
    whatever its value (``Exists``), ``KEY=VALUE:EFFECT`` only with that value (``Equal``)."""
    pair, sep, effect = spec.rpartition(":")
    key, has_value, value = pair.partition("=")
    example = (
        "write KEY[=VALUE]:EFFECT, e.g. --toleration dedicated=training:NoSchedule "
        f"(EFFECT: {', '.join(EFFECTS)})"
    )
    if not sep or not key:
        raise UsageError(f"--toleration {spec!r} is not KEY[=VALUE]:EFFECT", example)
    if effect not in EFFECTS:
        raise UsageError(f"--toleration {spec!r}: {effect!r} is not a taint effect", example)
    check_qualified_name("--toleration", key)
    if has_value and not LABEL_VALUE.fullmatch(value):
        raise UsageError(
            f"--toleration {spec!r}: the value {value!r} is not a taint value",
            "use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        )
    if has_value:
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}


def check_scheduling(
    *,
    tolerations: Sequence[str],
    priority_class: str | None,
    scheduler_name: str | None,
    service_account: str | None,
    queue: str | None,
    ttl: int | None,
) -> None:
    """Every scheduling option must be of the form Kubernetes takes (``UsageError`` otherwise)."""
    for spec in tolerations:
        toleration(spec)
    for flag, value, what in (
        ("--priority-class", priority_class, "PriorityClass"),
        ("--scheduler-name", scheduler_name, "scheduler"),
        ("--service-account", service_account, "ServiceAccount"),
        ("--queue", queue, "queue"),
    ):
        if value is not None:
            check_dns_subdomain(flag, value, what)
    if queue is not None and len(queue) > 63:
        raise UsageError(
            f"--queue {queue!r} is longer than 63 characters, too long for the value of the "
            f"{QUEUE_LABEL} label",
            "use the name of a LocalQueue of at most 63 characters",
        )
    if ttl is not None and not 0 <= ttl <= _INT32_MAX:
        raise UsageError(
            f"--ttl {ttl} is not a number of seconds Kubernetes takes",
            f"give 0 to {_INT32_MAX:,} seconds, e.g. --ttl 86400 (the finished Job is deleted a day later)",
        )


def check_queue(
    queue: str | None, *, scheduler_name: str | None, labels: Mapping[str, str], two_jobs: bool
) -> None:
    """Kueue admits one workload per Job: with the control Job beside the training Job
    (``two_jobs``) they would be queued apart, so ``--queue`` needs the JobSet there."""
    if QUEUE_LABEL in labels:
        raise UsageError(
            f"--label {QUEUE_LABEL} would put every object and pod into a Kueue queue",
            f"use --queue {labels[QUEUE_LABEL] or 'NAME'} (the label goes on the workload only)",
        )
    if queue is not None and scheduler_name != VOLCANO and two_jobs:
        raise UsageError(
            f'--queue {queue} with [rendezvous] store = "control" would queue the control Job and '
            "the training Job as two Kueue workloads, admitted apart: the control pod gives up when "
            "the training pods wait in the queue longer than [rendezvous] join_timeout",
            "add --jobset (Kueue admits a JobSet, control pod included, as one workload), or set "
            'store = "pod0" in [rendezvous]',
        )


def check_annotations(annotations: Mapping[str, str], reserved: Collection[str]) -> None:
    """``--annotation`` keys must be qualified names and not the ones nvtrain sets itself."""
    for key, value in annotations.items():
        check_qualified_name("--annotation", key)
        if key in reserved:
            raise UsageError(f"--annotation {key}={value!r}: {key} is set by nvtrain", "leave it out")


def pull_policy(image: str) -> str:
    """``Always`` for an image without a tag or with the tag ``latest`` (unless pinned by a
    digest), ``IfNotPresent`` otherwise: Kubernetes' own default, written out."""
    if "@" in image:
        return "IfNotPresent"
    tag = re.sub(r"^.*/", "", image).partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def pod_templates(workload: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], int]]:
    """(pod spec, pods that run at once) of each pod template of a rendered Job or JobSet:
    ``parallelism`` (default 1), times a replicated job's ``replicas``."""

    def job(spec: Mapping[str, Any], replicas: int) -> tuple[Mapping[str, Any], int]:
        return spec["template"]["spec"], int(spec.get("parallelism", 1)) * replicas

    if workload.get("kind") == "Job":
        return [job(workload["spec"], 1)]
    if workload.get("kind") == "JobSet":
        return [
            job(rj["template"]["spec"], int(rj.get("replicas", 1)))
            for rj in workload["spec"]["replicatedJobs"]
        ]
    return []


def min_resources(pods: Sequence[tuple[Mapping[str, Any], int]]) -> dict[str, str]:
    """What ``pods`` (pod spec, count) request together: each container's ``requests`` (its
    ``limits`` for a resource it does not request, as Kubernetes defaults them), summed over the
    containers and times the count. Init containers run before and are left out. CPU is
    written in cores or millicores, memory in bytes' shortest form, other resources as counts."""
    totals: dict[str, Fraction] = {}
    for spec, count in pods:
        for container in spec.get("containers", []):
            resources = container.get("resources", {})
            wanted = {**resources.get("limits", {}), **resources.get("requests", {})}
            for name, value in wanted.items():
                totals[name] = totals.get(name, Fraction(0)) + parse_quantity(name, str(value)) * count
    out: dict[str, str] = {}
    for name, total in sorted(totals.items(), key=lambda kv: (kv[0] not in ("cpu", "memory"), kv[0])):
        if name == "cpu":
            out[name] = format_cpu(total)
        elif name in ("memory", "ephemeral-storage") or name.startswith("hugepages-"):
            out[name] = format_bytes(total)
        else:
            out[name] = str(math.ceil(total))
    return out


def pod_group(
    *,
    metadata: dict[str, Any],
    min_member: int,
    queue: str | None,
    priority_class: str | None,
    min_resources: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Volcano PodGroup of the job: ``min_member`` pods (every pod of the job) start together
    or not at all, in ``queue`` (Volcano's ``default`` queue when None). ``min_resources``: what
    those pods request together (``min_resources``), so that Volcano admits the group only when
    the queue has room for all of it, instead of starting pods that then wait for the rest."""
    spec: dict[str, Any] = {"minMember": min_member}
    if min_resources:
        spec["minResources"] = dict(min_resources)
    if queue is not None:
        spec["queue"] = queue
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": metadata,
        "spec": spec,
    }

"""The reference checks of ``nvtrain validate --manifest``: what the pods depend on still holds.

A rendered manifest is a set of objects that name each other: the pods mount the policy
ConfigMap by name, name their Volcano PodGroup in an annotation, are picked by the Service, the
NetworkPolicy and the PodMonitor through their labels, and run ``nvtrain run`` in the container
that the pod failure policy names, with the run id taken from the workload's UID, the checkpoint
volume at ``[checkpoint] dir`` and one GPU per rank. Kustomize (``namePrefix``, ``commonLabels``)
and hand-written patches change one side of such a reference and not the other, and Kubernetes
accepts the result: the pods then wait in ContainerCreating or Pending forever, holding GPUs and
quota, or run with the rendezvous store open to the cluster. These checks read the manifest as it
will be applied and report each broken reference with the object, the field, the value and the
fix.

References that the file cannot settle are left alone: a file with no ConfigMap, PodGroup or
NetworkPolicy may be one part of a larger set, and labels that controllers add to pods
(``batch.kubernetes.io/...``, ``jobset.sigs.k8s.io/...``) are taken to match.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from nvtrain.findings import Finding
from nvtrain.kube.ref_container import training_container
from nvtrain.kube.ref_objects import (
    backoff,
    configmap_refs,
    failure_policy,
    group_members,
    group_ref,
    jobset_name_refs,
    network_policy_refs,
    pod_monitor_refs,
    service_refs,
)
from nvtrain.kube.ref_pods import Checker, names_of, pods_of
from nvtrain.kube.yaml_positions import Doc as _Doc
from nvtrain.kube.yaml_positions import get as _get

__all__ = ["Checker", "check_references"]


def check_references(checker: Checker, docs: Sequence[_Doc]) -> Iterator[Finding]:
    """Every broken reference of the manifest ``docs`` (see the module's docstring)."""
    # A Job without a pod template has its shape finding already.
    pods = [p for p in pods_of(checker, docs) if isinstance(p.get(*p.spec), dict)]
    configmaps = names_of(docs, "ConfigMap")
    groups = names_of(docs, "PodGroup")
    for pod in pods:
        yield from configmap_refs(checker, pod, configmaps)
        yield from group_ref(checker, pod, groups)
        yield from failure_policy(checker, pod)
        if not pod.control:
            yield from training_container(checker, pod)
            yield from backoff(checker, pod)
    yield from group_members(checker, docs, pods)
    for doc in docs:
        kind = doc.data.get("kind")
        ours = _get(doc.data, ("metadata", "labels", "app.kubernetes.io/managed-by")) == "nvtrain"
        if kind == "NetworkPolicy" and ours:  # one of the user's own may select what it likes
            yield from network_policy_refs(checker, doc, pods)
        elif kind == "Service":
            yield from service_refs(checker, doc, pods)
        elif kind == "PodMonitor" and ours:
            yield from pod_monitor_refs(checker, doc, pods)
        elif kind == "JobSet":
            yield from jobset_name_refs(checker, doc)

"""What the job needs of the set of objects, after any edit: ``nvtrain validate --manifest``
checks what the pods rely on, not the shape ``nvtrain manifest`` rendered it in.

A file that holds nvtrain's objects besides the workload (``managed-by: nvtrain``: the policy
ConfigMap, the Service, the NetworkPolicy) is a whole render, so an object missing from it was
removed (a ``$patch: delete``), not left in another file: the NetworkPolicy (the rendezvous store,
which has no authentication, is open to every pod), the Service that the pods' subdomain names
(no DNS names), the policy ConfigMap (the pods wait in ContainerCreating), the PodGroup the pods
name (Volcano never schedules them). A Kueue queue label where Kueue cannot queue the job as one
workload (a plain control Job beside the training Job, a Volcano job, a Trainer runtime), and a
Service that is no longer headless (no per-pod DNS names) are errors too. The checks of each
pod template are ``edit_pods``'; the rules the API server enforces are ``api_rules``'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from nvtrain.findings import Finding
from nvtrain.kube.api_rules import api_rules
from nvtrain.kube.edit_pods import pod_checks
from nvtrain.kube.ref_pods import Checker, Pods, names_of, pods_of
from nvtrain.kube.scheduling import GROUP_ANNOTATION, QUEUE_LABEL, VOLCANO
from nvtrain.kube.yaml_positions import MISSING as _MISSING
from nvtrain.kube.yaml_positions import TRAINER_RUNTIMES
from nvtrain.kube.yaml_positions import Doc as _Doc
from nvtrain.kube.yaml_positions import get as _get

__all__ = ["edit_checks", "monitoring_elsewhere"]

_WORKLOADS = ("Job", "JobSet", *TRAINER_RUNTIMES)


def _ours(doc: _Doc) -> bool:
    return bool(_get(doc.data, ("metadata", "labels", "app.kubernetes.io/managed-by")) == "nvtrain")


def monitoring_elsewhere(doc: _Doc) -> bool:
    """An object that may live in another namespace than the job's: the PrometheusRule and the
    Grafana dashboard ConfigMap (Prometheus and Grafana read them wherever they are configured
    to), and a PodMonitor that names the job's namespace in its ``namespaceSelector``."""
    kind = doc.data.get("kind")
    if kind == "PrometheusRule":
        return True
    if kind == "ConfigMap":
        return _get(doc.data, ("metadata", "labels", "grafana_dashboard")) is not _MISSING
    return kind == "PodMonitor" and isinstance(_get(doc.data, ("spec", "namespaceSelector")), dict)


def edit_checks(checker: Checker, docs: Sequence[_Doc]) -> Iterator[Finding]:
    """Every finding of this module, of ``edit_pods`` and of ``api_rules`` about ``docs``."""
    pods = [p for p in pods_of(checker, docs) if isinstance(p.get(*p.spec), dict)]
    yield from api_rules(checker, docs, pods)
    yield from pod_checks(checker, docs, pods)
    whole = any(_ours(d) and d.data.get("kind") not in _WORKLOADS for d in docs)
    if whole and pods:
        yield from _missing(checker, docs, pods)
    yield from _queues(checker, docs, pods)
    yield from _headless(checker, docs, pods)


def _removed(checker: Checker, kind: str, rule: str) -> Finding:
    finding = checker.finding(
        "error",
        "manifest-missing",
        None,
        (),
        _MISSING,
        f"is not in the file, which holds the rest of what `nvtrain manifest` renders (a "
        f"`$patch: delete`?): {rule}",
        f"keep the {kind} (delete it with the job, not before), or {checker.rerender}",
    )
    return dataclasses.replace(finding, table=kind)


def _missing(checker: Checker, docs: Sequence[_Doc], pods: Sequence[Pods]) -> Iterator[Finding]:
    kinds = {d.data.get("kind") for d in docs}
    if "NetworkPolicy" not in kinds:
        yield _removed(
            checker,
            "NetworkPolicy",
            "nothing limits who reaches the pods, so the rendezvous store, which has no "
            "authentication, and the workers' ports are open to every pod of the cluster",
        )
    # The Service was removed when a Job's subdomain still names it (renamed or not); a subdomain
    # that names another Service may name one of another file (test_manifest_renamed.py).
    service = checker.policy.service if checker.policy is not None else None
    jobs = [p for p in pods if p.doc.data.get("kind") == "Job"]
    subdomains = [s for p in jobs if isinstance(s := p.get(*p.spec, "subdomain"), str)]
    if "Service" not in kinds and any(service is None or service in s for s in subdomains):
        yield _removed(
            checker,
            "Service",
            "the headless Service named by the pods' subdomain gives them their DNS names; "
            "without it every pod waits [rendezvous] dns_timeout and exits 3",
        )
    configmaps = names_of(docs, "ConfigMap")
    groups = names_of(docs, "PodGroup")
    for pod in pods:
        volumes = pod.get(*pod.spec, "volumes")
        for i, volume in enumerate(volumes if isinstance(volumes, list) else []):
            name = _get(volume, ("configMap", "name"))
            if _get(volume, ("name",)) == "policy" and isinstance(name, str) and not configmaps:
                yield checker.finding(
                    "error",
                    "manifest-configmap",
                    pod.doc,
                    (*pod.spec, "volumes", i, "configMap", "name"),
                    name,
                    f"names the policy ConfigMap, which is not in the file (a `$patch: delete`?): "
                    f"{pod.what()} wait in ContainerCreating for it forever, holding their GPUs and quota",
                    f"keep the ConfigMap in the file, or {checker.rerender}",
                )
        path = (*pod.template, "metadata", "annotations", GROUP_ANNOTATION)
        group = pod.get(*path)
        if isinstance(group, str) and group not in groups and not groups:
            yield checker.finding(
                "error",
                "manifest-podgroup",
                pod.doc,
                path,
                group,
                f"names the PodGroup {group}, which is not in the file (a `$patch: delete`?): "
                f"Volcano keeps {pod.what()} Pending, waiting for a group that does not exist",
                f"keep the PodGroup in the file, or {checker.rerender}",
            )


def _queued(doc: _Doc) -> Any:
    return _get(doc.data, ("metadata", "labels", QUEUE_LABEL))


def _queues(checker: Checker, docs: Sequence[_Doc], pods: Sequence[Pods]) -> Iterator[Finding]:
    """A Kueue queue label that Kueue cannot honour for this job."""
    path = ("metadata", "labels", QUEUE_LABEL)
    volcano = {id(p.doc) for p in pods if p.get(*p.spec, "schedulerName") == VOLCANO}
    plain = [p for p in pods if p.doc.data.get("kind") == "Job"]
    two_jobs = any(p.control for p in plain) and any(not p.control for p in plain)
    for doc in docs:
        queue = _queued(doc)
        if queue is _MISSING:
            continue
        kind = doc.data.get("kind")
        if kind in TRAINER_RUNTIMES:
            rule = (
                "Kueue takes the queue from each TrainJob, not from its runtime: the TrainJobs "
                "of this runtime are not queued, and start whether or not the queue has room"
            )
            fix = f"remove the label here, and label each TrainJob {QUEUE_LABEL}: {queue}"
        elif id(doc) in volcano:
            rule = (
                "the pods are Volcano's (schedulerName: volcano, queued by their PodGroup): "
                "Kueue would suspend the Job and admit it by its own quota while Volcano queues "
                "the same pods again, so two schedulers hold them"
            )
            fix = "remove the label: the PodGroup's spec.queue is the job's Volcano queue"
        elif kind == "Job" and two_jobs:
            rule = (
                'with [rendezvous] store = "control" the control Job and the training Job are '
                "two Kueue workloads, admitted apart: the control pod gives up when the training "
                "pods wait in the queue longer than [rendezvous] join_timeout (`nvtrain manifest "
                "--queue` refuses this)"
            )
            fix = 'render with --jobset --queue NAME (one workload), or set store = "pod0" in [rendezvous]'
        else:
            continue
        yield checker.finding("error", "manifest-queue", doc, path, queue, rule, fix)


def _headless(checker: Checker, docs: Sequence[_Doc], pods: Sequence[Pods]) -> Iterator[Finding]:
    """The Service the pods' subdomain names must be headless: only then does each pod get a
    DNS name of its own."""
    named = {p.get(*p.spec, "subdomain") for p in pods if p.doc.data.get("kind") == "Job"}
    for doc in docs:
        if doc.data.get("kind") != "Service" or _get(doc.data, ("metadata", "name")) not in named:
            continue
        found = _get(doc.data, ("spec", "clusterIP"))
        if found == "None":
            continue
        yield checker.finding(
            "error",
            "manifest-service",
            doc,
            ("spec", "clusterIP"),
            found,
            "is not None: the Service is not headless, so the pods get no DNS names of their own "
            "(<pod>.<service>...), every pod waits [rendezvous] dns_timeout and exits 3",
            "set clusterIP: None (and no type other than ClusterIP), or render again",
        )

"""What the pods need of their own template, after any edit (part of ``edit_checks``): the policy
file they run is mounted, the training Job is Indexed (the pods take their index from it), the
pods are off the host network, ``/dev/shm`` fits in the memory limit, the metrics port is the
policy's (and the PodMonitor and the NetworkPolicy name it), pods that name a Volcano PodGroup
are Volcano's, and a render for Pod Security ``restricted`` still passes it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import PurePosixPath
from typing import Any

from nvtrain.findings import Finding, toml_value
from nvtrain.kube.api_rules import quantity
from nvtrain.kube.objects import INDEX_ANNOTATION, POLICY_MOUNT
from nvtrain.kube.quantity import format_bytes
from nvtrain.kube.ref_pods import Checker, Pods, names_of
from nvtrain.kube.scheduling import GROUP_ANNOTATION, VOLCANO
from nvtrain.kube.sizing import SHM_MOUNT
from nvtrain.kube.yaml_positions import MISSING as _MISSING
from nvtrain.kube.yaml_positions import Doc as _Doc
from nvtrain.kube.yaml_positions import YamlPath
from nvtrain.kube.yaml_positions import get as _get

__all__ = ["pod_checks"]

_PER_RANK = 2**30
"""Memory below which a rank cannot run beside ``/dev/shm`` (a Python process with torch)."""


def pod_checks(checker: Checker, docs: Sequence[_Doc], pods: Sequence[Pods]) -> Iterator[Finding]:
    groups = names_of(docs, "PodGroup")
    for pod in pods:
        yield from _policy_file(checker, pod)
        yield from _host_network(checker, pod)
        yield from _restricted(checker, pod)
        yield from _volcano(checker, pod, groups)
        if not pod.control:
            yield from _indexed(checker, pod)
            yield from _shm(checker, pod)
            yield from _metrics_port(checker, pod)
    yield from _metrics_objects(checker, docs, [p for p in pods if not p.control])


def _words(container: dict[str, Any]) -> list[str]:
    words: list[str] = []
    for key in ("command", "args"):
        items = container.get(key)
        words += [w for item in (items if isinstance(items, list) else []) for w in str(item).split()]
    return words


def _policy_file(checker: Checker, pod: Pods) -> Iterator[Finding]:
    """``nvtrain run|control FILE`` with FILE under ``/etc/nvtrain``, where nothing is mounted."""
    for c, container in enumerate(pod.containers()):
        if not isinstance(container, dict):
            continue
        words = _words(container)
        runs = [
            i
            for i in range(len(words) - 1)
            if words[i].endswith("nvtrain") and words[i + 1] in ("run", "control")
        ]
        files = [w for i in runs for w in words[i + 2 :] if w.endswith(".toml") and not w.startswith("-")]
        if not files or not PurePosixPath(files[0]).is_relative_to(POLICY_MOUNT):
            continue
        mounts = container.get("volumeMounts")
        paths = [_get(m, ("mountPath",)) for m in (mounts if isinstance(mounts, list) else [])]
        if any(isinstance(m, str) and PurePosixPath(files[0]).is_relative_to(m) for m in paths):
            continue  # a mount of another file than the policy's is manifest-command's of ref_container
        key = "command" if "command" in container else "args"
        yield checker.finding(
            "error",
            "manifest-command",
            pod.doc,
            (*pod.spec, "containers", c, key),
            container.get(key, _MISSING),
            f"runs nvtrain on {files[0]}, but nothing is mounted at {POLICY_MOUNT} (the policy "
            f"ConfigMap's mount was removed): every pod of {pod.doc.label} exits 2 at once (no such "
            "policy file), and the Job fails",
            f"mount the policy ConfigMap's volume at {POLICY_MOUNT} (readOnly), or render again",
        )


def _host_network(checker: Checker, pod: Pods) -> Iterator[Finding]:
    path: YamlPath = (*pod.spec, "hostNetwork")
    if pod.get(*path) is not True:
        return
    yield checker.finding(
        "error",
        "manifest-host-network",
        pod.doc,
        path,
        True,
        f"puts {pod.what()} on their nodes' network: the NetworkPolicy does not apply to them (the "
        "rendezvous store, which has no authentication, is open to the whole network), their "
        "hostnames are the nodes', not <job>-<index>, and two pods on one node fight for the "
        "rendezvous port",
        "remove hostNetwork (NCCL and EFA do not need it: the device plugins give the pods the devices)",
    )


def _restricted(checker: Checker, pod: Pods) -> Iterator[Finding]:
    """A render for ``--pod-security restricted`` (its seccomp profile tells) that no longer passes."""
    context = pod.get(*pod.spec, "securityContext")
    if _get(context, ("seccompProfile", "type")) != "RuntimeDefault":
        return
    broken: list[tuple[YamlPath, Any, str]] = []
    if _get(context, ("runAsNonRoot",)) is False:
        broken.append(((*pod.spec, "securityContext", "runAsNonRoot"), False, "runs as root"))
    if _get(context, ("runAsUser",)) == 0:
        broken.append(((*pod.spec, "securityContext", "runAsUser"), 0, "runs as root"))
    for c, container in enumerate(pod.containers()):
        at: YamlPath = (*pod.spec, "containers", c, "securityContext")
        own = _get(container, ("securityContext",))
        if _get(own, ("privileged",)) is True:
            broken.append(((*at, "privileged"), True, "is privileged"))
        if _get(own, ("allowPrivilegeEscalation",)) is not False:
            value = _get(own, ("allowPrivilegeEscalation",))
            broken.append(((*at, "allowPrivilegeEscalation"), value, "allows privilege escalation"))
        added = _get(own, ("capabilities", "add"))
        extra = [a for a in (added if isinstance(added, list) else []) if a != "NET_BIND_SERVICE"]
        if extra:
            broken.append(
                ((*at, "capabilities", "add"), added, f"adds capabilities {', '.join(map(str, extra))}")
            )
        if _get(own, ("runAsNonRoot",)) is False or _get(own, ("runAsUser",)) == 0:
            broken.append((at, own, "runs as root"))
    for path, value, what in broken:
        yield checker.finding(
            "error",
            "manifest-pod-security",
            pod.doc,
            path,
            value,
            f"{what}, which Pod Security restricted forbids, and {pod.doc.label} was rendered for "
            "it (--pod-security restricted): in a namespace that enforces it the Job is created "
            "and its pods never are",
            "undo the edit, or render with the level the namespace enforces "
            "(--pod-security baseline, or none)",
        )


def _volcano(checker: Checker, pod: Pods, groups: set[str]) -> Iterator[Finding]:
    group = pod.get(*pod.template, "metadata", "annotations", GROUP_ANNOTATION)
    path: YamlPath = (*pod.spec, "schedulerName")
    scheduler = pod.get(*path)
    if group not in groups or scheduler == VOLCANO:
        return
    yield checker.finding(
        "error",
        "manifest-podgroup",
        pod.doc,
        path,
        scheduler,
        f"is not {VOLCANO}, but {pod.what()} name the Volcano PodGroup {group}: the default "
        "scheduler starts them one by one, without the gang, and the PodGroup waits for members "
        "that Volcano never schedules",
        f"set schedulerName: {VOLCANO}, or render again without --scheduler-name",
    )


def _indexed(checker: Checker, pod: Pods) -> Iterator[Finding]:
    """The pods read their index from the Job's completion-index annotation: only an Indexed Job has it."""
    path: YamlPath = (*pod.job, "completionMode")
    mode = pod.get(*path)
    if mode == "Indexed" or (mode is _MISSING and pod.jobset):
        return
    uses = any(
        INDEX_ANNOTATION in str(_get(e, ("valueFrom", "fieldRef", "fieldPath")))
        for c in pod.containers()
        for e in (_get(c, ("env",)) if isinstance(_get(c, ("env",)), list) else [])
    )
    if not uses:
        return
    yield checker.finding(
        "error",
        "manifest-indexed",
        pod.doc,
        path,
        mode,
        f"{'(not set: a Job is NonIndexed) ' if mode is _MISSING else ''}is not Indexed: the "
        f"training pods take JOB_COMPLETION_INDEX from the annotation {INDEX_ANNOTATION}, which "
        "only an Indexed Job gives them, and get no hostnames <job>-<index>: no pod is pod 0 and "
        "none finds its peers",
        "set completionMode: Indexed, or render again",
    )


def _training(pod: Pods) -> tuple[int, dict[str, Any]] | None:
    containers = [(i, c) for i, c in enumerate(pod.containers()) if isinstance(c, dict)]
    named = [ic for ic in containers if ic[1].get("name") == pod.container_name]
    found = named or containers
    return found[0] if found else None


def _shm(checker: Checker, pod: Pods) -> Iterator[Finding]:
    """A memory-backed ``/dev/shm`` counts against the container's memory limit."""
    found = _training(pod)
    if found is None:
        return
    c, container = found
    volumes = pod.get(*pod.spec, "volumes")
    volumes = volumes if isinstance(volumes, list) else []
    mounts = container.get("volumeMounts")
    names = {
        _get(m, ("name",))
        for m in (mounts if isinstance(mounts, list) else [])
        if _get(m, ("mountPath",)) == SHM_MOUNT
    }
    shm = [
        (i, v)
        for i, v in enumerate(volumes)
        if _get(v, ("name",)) in names and _get(v, ("emptyDir", "medium")) == "Memory"
    ]
    at: YamlPath = (*pod.spec, "containers", c, "resources", "limits", "memory")
    limit = quantity(pod.get(*at))
    if not shm or limit is None:
        return
    size = quantity(_get(shm[0][1], ("emptyDir", "sizeLimit")))
    size_shown = format_bytes(size) if size is not None else "not limited"
    nproc = checker.policy.job.nproc_per_node if checker.policy is not None else None
    ranks = nproc if isinstance(nproc, int) else 1
    if size is None or limit - size >= ranks * _PER_RANK:
        return
    yield checker.finding(
        "error",
        "manifest-memory",
        pod.doc,
        at,
        pod.get(*at),
        f"leaves {'nothing' if limit <= size else format_bytes(limit - size)} for the {ranks} "
        f"rank{'s' if ranks != 1 else ''} beside /dev/shm (sizeLimit {size_shown}): a memory-backed "
        "emptyDir counts against the container's memory limit, so the pod is OOM-killed (exit 137) "
        "as /dev/shm fills, long before it reaches its size",
        "keep the memory limit above /dev/shm's size plus the ranks' memory (nvtrain renders "
        "16Gi per rank + /dev/shm): set memory, or --shm-size, and render again",
    )


def _metrics_port(checker: Checker, pod: Pods) -> Iterator[Finding]:
    p = checker.policy
    if p is None or not p.metrics.enabled:
        return
    for c, container in enumerate(pod.containers()):
        ports = _get(container, ("ports",))
        for i, port in enumerate(ports if isinstance(ports, list) else []):
            if _get(port, ("name",)) != "metrics" or _get(port, ("containerPort",)) == p.metrics.port:
                continue
            yield checker.finding(
                "error",
                "manifest-metrics-port",
                pod.doc,
                (*pod.spec, "containers", c, "ports", i, "containerPort"),
                _get(port, ("containerPort",)),
                f"is not [metrics] port = {p.metrics.port}, where `nvtrain run` serves the metrics: "
                "Prometheus scrapes this port and gets nothing",
                f"set it to {p.metrics.port}, or change [metrics] port and render again",
            )


def _metrics_objects(checker: Checker, docs: Sequence[_Doc], training: Sequence[Pods]) -> Iterator[Finding]:
    """The PodMonitor names a port of the training pods; the NetworkPolicy admits the metrics port."""
    p = checker.policy
    names = {
        _get(port, ("name",))
        for pod in training
        for c in pod.containers()
        for port in (_get(c, ("ports",)) if isinstance(_get(c, ("ports",)), list) else [])
    }
    for doc in docs:
        if _get(doc.data, ("metadata", "labels", "app.kubernetes.io/managed-by")) != "nvtrain":
            continue
        kind = doc.data.get("kind")
        if kind == "PodMonitor" and training:
            endpoints = _get(doc.data, ("spec", "podMetricsEndpoints"))
            for i, endpoint in enumerate(endpoints if isinstance(endpoints, list) else []):
                port = _get(endpoint, ("port",))
                if isinstance(port, str) and port not in names:
                    yield checker.finding(
                        "error",
                        "manifest-metrics-port",
                        doc,
                        ("spec", "podMetricsEndpoints", i, "port"),
                        port,
                        f"names no port of the training pods (their ports: "
                        f"{', '.join(sorted(map(str, names - {None}))) or 'none'}): Prometheus "
                        "scrapes nothing of this job",
                        'set it to "metrics", the name of the metrics port, or render again',
                    )
        elif kind == "NetworkPolicy" and p is not None and p.metrics.enabled and training:
            rules = _get(doc.data, ("spec", "ingress"))
            rules = rules if isinstance(rules, list) else []
            allowed = [
                _get(port, ("port",))
                for rule in rules
                for port in (_get(rule, ("ports",)) if isinstance(_get(rule, ("ports",)), list) else [])
            ]
            open_rule = any(isinstance(r, dict) and not r.get("ports") and not r.get("from") for r in rules)
            if not allowed or open_rule or p.metrics.port in allowed or "metrics" in allowed:
                continue  # no port rule: metrics only from the job's own pods, as rendered for none
            yield checker.finding(
                "error",
                "manifest-metrics-port",
                doc,
                ("spec", "ingress"),
                allowed,
                f"admits the ports {toml_value(allowed)} but not [metrics] port = {p.metrics.port}: "
                "Prometheus cannot reach the metrics, and scrapes nothing of this job",
                f"admit port {p.metrics.port} (or the port name metrics), or render again",
            )

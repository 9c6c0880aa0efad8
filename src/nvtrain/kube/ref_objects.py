"""The references between the objects of a manifest: the policy ConfigMap and the Volcano
PodGroup that the pods name, the pod failure policy's container and the backoff limits, the
selectors of the Service, the NetworkPolicy and the PodMonitor against the pods' labels, and the
names the JobSet webhook refuses. Part of ``manifest_refs``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from nvtrain.findings import Finding, toml_value
from nvtrain.kube.jobset import JOBSET_POD_SUFFIX
from nvtrain.kube.objects import NEVER_RETRY, POLICY_MOUNT
from nvtrain.kube.ref_pods import KUSTOMIZE, Checker, Pods
from nvtrain.kube.scheduling import GROUP_ANNOTATION
from nvtrain.kube.yaml_positions import MISSING as _MISSING
from nvtrain.kube.yaml_positions import Doc as _Doc
from nvtrain.kube.yaml_positions import YamlPath
from nvtrain.kube.yaml_positions import get as _get
from nvtrain.kubenames import DNS_1035_LABEL

__all__ = [
    "backoff",
    "configmap_refs",
    "failure_policy",
    "group_members",
    "group_ref",
    "jobset_name_refs",
    "network_policy_refs",
    "pod_monitor_refs",
    "service_refs",
]


# -- names: ConfigMap, PodGroup --------------------------------------------------------------------


def _policy_volumes(pod: Pods) -> set[str]:
    """Names of the volumes that hold the policy: ``policy``, and any mounted at ``/etc/nvtrain``."""
    names = {"policy"}
    for container in pod.containers():
        mounts = _get(container, ("volumeMounts",))
        for mount in mounts if isinstance(mounts, list) else []:
            if _get(mount, ("mountPath",)) == POLICY_MOUNT and isinstance(_get(mount, ("name",)), str):
                names.add(mount["name"])
    return names


def configmap_refs(checker: Checker, pod: Pods, configmaps: set[str]) -> Iterator[Finding]:
    """The policy's ConfigMap volume names a ConfigMap of the file (when the file has any).
    Other ConfigMap volumes (``--volume configmap:...``) may name the user's own ConfigMaps,
    which the file need not hold."""
    if not configmaps:
        return
    volumes = pod.get(*pod.spec, "volumes")
    policy_volumes = _policy_volumes(pod)
    for i, volume in enumerate(volumes if isinstance(volumes, list) else []):
        path: YamlPath = (*pod.spec, "volumes", i, "configMap", "name")
        name = _get(volume, ("configMap", "name"))
        if not isinstance(name, str) or name in configmaps or _get(volume, ("name",)) not in policy_volumes:
            continue
        renamed = [c for c in configmaps if c.endswith(name) or c.startswith(name)]
        hint = (
            f" (the file has {renamed[0]}: renamed by a Kustomize namePrefix or nameSuffix?)"
            if renamed
            else ""
        )
        yield checker.finding(
            "error",
            "manifest-configmap",
            pod.doc,
            path,
            name,
            f"names no ConfigMap of this file{hint}: {pod.what()} wait in ContainerCreating for it "
            "forever, holding their GPUs and quota. Kustomize renames a ConfigMap's references "
            "in Jobs, but not in a JobSet, which it does not know",
            f"make Kustomize rename it with the ConfigMap: add {KUSTOMIZE}; or set it to the "
            "ConfigMap's name",
        )


def group_ref(checker: Checker, pod: Pods, groups: set[str]) -> Iterator[Finding]:
    """The Volcano group annotation names a PodGroup of the file (when the file has any)."""
    if not groups:
        return
    path: YamlPath = (*pod.template, "metadata", "annotations", GROUP_ANNOTATION)
    name = pod.get(*path)
    listed = ", ".join(sorted(groups))
    if name is _MISSING:
        yield checker.finding(
            "warning",
            "manifest-podgroup",
            pod.doc,
            path,
            name,
            f"is not set, but the file has the PodGroup {listed}: Volcano schedules {pod.what()} "
            "without it, one by one, and the PodGroup waits for members that never come",
            f"set the annotation {GROUP_ANNOTATION} to the PodGroup's name, or render again",
        )
    elif name not in groups:
        yield checker.finding(
            "error",
            "manifest-podgroup",
            pod.doc,
            path,
            name,
            f"names no PodGroup of this file (PodGroups: {listed}): Volcano keeps {pod.what()} "
            "Pending, waiting for a group that does not exist. A Kustomize namePrefix or "
            "nameSuffix renames the PodGroup but not this annotation",
            f"make Kustomize rename it with the PodGroup: add {KUSTOMIZE}; or set it to the PodGroup's name",
        )


def group_members(checker: Checker, docs: Sequence[_Doc], pods: Sequence[Pods]) -> Iterator[Finding]:
    """A PodGroup's ``minMember`` against the pods that name it: more and Volcano never starts any."""
    for doc in docs:
        if doc.data.get("kind") != "PodGroup":
            continue
        name = _get(doc.data, ("metadata", "name"))
        want = _get(doc.data, ("spec", "minMember"))
        members = [p for p in pods if p.get(*p.template, "metadata", "annotations", GROUP_ANNOTATION) == name]
        counts = [p.count() for p in members]
        if not members or not isinstance(want, int) or any(c is None for c in counts):
            continue
        have = sum(c for c in counts if c is not None)
        if want > have:
            yield checker.finding(
                "error",
                "manifest-podgroup",
                doc,
                ("spec", "minMember"),
                want,
                f"is more than the {have} pods that name this PodGroup: Volcano starts none of them "
                "and they stay Pending forever",
                f"set minMember to {have} (the training pods plus the control pod), or render again",
            )
        elif want < have:
            yield checker.finding(
                "warning",
                "manifest-podgroup",
                doc,
                ("spec", "minMember"),
                want,
                f"is less than the {have} pods that name this PodGroup: Volcano may start some of "
                "them while the others wait, and those hold GPUs without training",
                f"set minMember to {have}, or render again",
            )


# -- the pod failure policy ------------------------------------------------------------------------


def failure_policy(checker: Checker, pod: Pods) -> Iterator[Finding]:
    """Every container the rules name exists (Kubernetes refuses the Job otherwise), exit codes
    2 and 4 (2 for the control pod) fail the Job, and disruptions are not counted."""
    names = [c.get("name") for c in pod.containers() if isinstance(c, dict)]
    path: YamlPath = (*pod.job, "podFailurePolicy")
    rules = pod.get(*path, "rules")
    rules = rules if isinstance(rules, list) else []
    for i, rule in enumerate(rules):
        named = _get(rule, ("onExitCodes", "containerName"))
        if isinstance(named, str) and named not in names:
            yield checker.finding(
                "error",
                "manifest-container",
                pod.doc,
                (*path, "rules", i, "onExitCodes", "containerName"),
                named,
                f"names no container of the pod template (containers: "
                f"{', '.join(map(str, names)) or 'none'}): Kubernetes refuses the Job. A patch "
                "that renames the container must rename it here too",
                f'set it to the container\'s name, or keep the container named "{pod.container_name}"',
            )
    want = {int(NEVER_RETRY[0])} if pod.control else set(NEVER_RETRY)
    failing: set[int] = set()
    ignores_disruption = False
    for rule in rules:
        if not isinstance(rule, dict):
            continue
        codes = _get(rule, ("onExitCodes", "values"))
        if rule.get("action") == "FailJob" and _get(rule, ("onExitCodes", "operator")) == "In":
            failing |= {c for c in codes if isinstance(c, int)} if isinstance(codes, list) else set()
        conditions = rule.get("onPodConditions")
        if rule.get("action") == "Ignore" and isinstance(conditions, list):
            ignores_disruption |= any(_get(c, ("type",)) == "DisruptionTarget" for c in conditions)
    missing = sorted(want - failing)
    if missing:
        shown = " and ".join(map(str, missing))
        yield checker.finding(
            "warning",
            "manifest-failure-policy",
            pod.doc,
            path if not rules else (*path, "rules"),
            pod.get(*path),
            f"has no FailJob rule for exit code{'s' if len(missing) > 1 else ''} {shown} "
            "(2: invalid policy, 4: the same fault repeats without progress): Kubernetes retries "
            "such a pod up to backoffLimit times, and every retry fails the same way, on GPUs",
            f"{checker.rerender} (podFailurePolicy: FailJob onExitCodes In {sorted(want)})",
        )
    if not ignores_disruption:
        yield checker.finding(
            "warning",
            "manifest-failure-policy",
            pod.doc,
            path if not rules else (*path, "rules"),
            pod.get(*path),
            "has no Ignore rule for the DisruptionTarget condition: preemptions, evictions and "
            "node drains count against backoffLimit, and a few of them fail the Job",
            f"{checker.rerender} (podFailurePolicy: Ignore onPodConditions DisruptionTarget)",
        )


def backoff(checker: Checker, pod: Pods) -> Iterator[Finding]:
    """A ``backoffLimit`` below the pods' count: one failure of every pod at once ends the Job."""
    count = pod.count()
    if count is None or count < 2 or pod.get(*pod.job, "backoffLimitPerIndex") is not _MISSING:
        return
    path: YamlPath = (*pod.job, "backoffLimit")
    value = pod.get(*path)
    limit = 6 if value is _MISSING else value  # Kubernetes' default
    if not isinstance(limit, int) or limit >= count:
        return
    yield checker.finding(
        "warning",
        "manifest-backoff",
        pod.doc,
        path,
        value,
        f"{'(not set: Kubernetes uses 6) ' if value is _MISSING else ''}is less than the {count} "
        "pods: one failure that hits every pod at once (DNS names not ready yet, a node pool "
        "restarted, the store's pod lost) fails the whole Job",
        f"{checker.rerender} (backoffLimit is --backoff-limit × the pods; --kubernetes 1.33 adds "
        "backoffLimitPerIndex)",
    )


# -- labels and selectors --------------------------------------------------------------------------


_CONTROLLER_LABELS = (
    "batch.kubernetes.io/",
    "jobset.sigs.k8s.io/",
    "trainer.kubeflow.org/",
    "controller-uid",
    "job-name",
)
"""Label keys that the Job, JobSet and Trainer controllers add to the pods they create: a
selector on them cannot be judged from the template, and is taken to match."""


def _added(key: Any) -> bool:
    """Whether ``key`` is a label that the Job or JobSet controller adds to its pods."""
    return isinstance(key, str) and key.startswith(_CONTROLLER_LABELS)


def _selects(selector: Any, labels: dict[str, Any]) -> bool:
    """Whether a label selector (``matchLabels``, ``matchExpressions``) picks a pod with
    ``labels``; a term on a label that a controller adds is taken to match."""
    if not isinstance(selector, dict):
        return False
    match = selector.get("matchLabels")
    for key, value in (match if isinstance(match, dict) else {}).items():
        if key not in labels and not _added(key) or key in labels and str(labels[key]) != str(value):
            return False
    expressions = selector.get("matchExpressions")
    for term in expressions if isinstance(expressions, list) else []:
        if not isinstance(term, dict) or _added(term.get("key")):
            continue
        key, operator = str(term.get("key")), term.get("operator")
        values = [str(v) for v in term.get("values") or []]
        present = key in labels
        ok = {
            "In": present and str(labels.get(key)) in values,
            "NotIn": not present or str(labels.get(key)) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(str(operator), True)
        if not ok:
            return False
    return True


def _labels_of(pods: Sequence[Pods]) -> str:
    shown = {pods[0].doc.label: pods[0].labels()} if pods else {}
    return "; ".join(f"{k}: {toml_value(v)}" for k, v in shown.items())


def network_policy_refs(checker: Checker, doc: _Doc, pods: Sequence[Pods]) -> Iterator[Finding]:
    """The NetworkPolicy covers every pod of the job, and lets them reach each other."""
    if not pods:
        return
    selector = _get(doc.data, ("spec", "podSelector"))
    covered = [p for p in pods if _selects(selector, p.labels())]
    if len(covered) < len(pods):
        left = [p for p in pods if p not in covered]
        yield checker.finding(
            "error",
            "manifest-selector",
            doc,
            ("spec", "podSelector"),
            selector,
            f"does not select {', '.join(p.what() for p in left)} (their labels: {_labels_of(left)}): "
            "the NetworkPolicy does not cover them, so the rendezvous store, which has no "
            "authentication, and the workers' ports are open to every pod of the cluster. A "
            "Kustomize commonLabels adds its labels to this selector, but not to the pods of a "
            "JobSet, which it does not know",
            f"make Kustomize label the pods too: add {KUSTOMIZE}; or make the selector match "
            "the pods' labels",
        )
    if not covered:
        return
    rules = _get(doc.data, ("spec", "ingress"))
    rules = rules if isinstance(rules, list) else []
    types = _get(doc.data, ("spec", "policyTypes"))
    if isinstance(types, list) and "Ingress" not in types:
        return
    if any(_admits_all(rule, pods) for rule in rules):
        return
    yield checker.finding(
        "error",
        "manifest-selector",
        doc,
        ("spec", "ingress"),
        rules,
        "admits no connection from the job's own pods on every port: the pods it covers cannot "
        "reach each other's rendezvous store and collectives, and every pod exits 3",
        "keep an ingress rule whose from.podSelector selects the job's pods (no ports), or render again",
    )


def _admits_all(rule: Any, pods: Sequence[Pods]) -> bool:
    """Whether an ingress rule admits the job's pods on every port."""
    if not isinstance(rule, dict) or rule.get("ports"):
        return False
    peers = rule.get("from")
    if not peers:
        return True
    for peer in peers if isinstance(peers, list) else []:
        if isinstance(peer, dict) and "podSelector" in peer and "ipBlock" not in peer:
            if all(_selects(peer["podSelector"], p.labels()) for p in pods):
                return True
    return False


def service_refs(checker: Checker, doc: _Doc, pods: Sequence[Pods]) -> Iterator[Finding]:
    """A Service named by the pods' ``subdomain`` selects them: else no DNS names."""
    name = _get(doc.data, ("metadata", "name"))
    named = [p for p in pods if p.get(*p.spec, "subdomain") == name and p.doc.data.get("kind") == "Job"]
    if not named:
        return
    selector = _get(doc.data, ("spec", "selector"))
    left = [
        p
        for p in named
        if not isinstance(selector, dict) or not _selects({"matchLabels": selector}, p.labels())
    ]
    if not left:
        return
    yield checker.finding(
        "error",
        "manifest-selector",
        doc,
        ("spec", "selector"),
        selector,
        f"does not select {', '.join(p.what() for p in left)}, whose subdomain names this Service "
        f"(their labels: {_labels_of(left)}): they get no DNS names, every pod waits "
        "[rendezvous] dns_timeout and exits 3",
        "make the selector match the pods' labels (a Kustomize commonLabels changes both), or render again",
    )


def pod_monitor_refs(checker: Checker, doc: _Doc, pods: Sequence[Pods]) -> Iterator[Finding]:
    """The PodMonitor of ``doc`` selects the training pods (by their labels)."""
    training = [p for p in pods if not p.control]
    selector = _get(doc.data, ("spec", "selector"))
    if not training or any(_selects(selector, p.labels()) for p in training):
        return
    yield checker.finding(
        "warning",
        "manifest-selector",
        doc,
        ("spec", "selector"),
        selector,
        f"selects none of the training pods (their labels: {_labels_of(training)}): Prometheus "
        "scrapes nothing of this job",
        f"make the selector match the pods' labels: add {KUSTOMIZE}; or render again",
    )


# -- names the JobSet webhook refuses --------------------------------------------------------------


def jobset_name_refs(checker: Checker, doc: _Doc) -> Iterator[Finding]:
    """What the JobSet validating webhook refuses: names made of the JobSet's name that are not
    DNS-1035 labels (a letter first, at most 63 characters), the pods' with a 6-character suffix."""
    name = _get(doc.data, ("metadata", "name"))
    if not isinstance(name, str):
        return
    fix = (
        "start the JobSet's name with a letter and keep it short (a Kustomize namePrefix adds "
        "to it), or render again"
    )
    if not DNS_1035_LABEL.fullmatch(name):
        yield checker.finding(
            "error",
            "manifest-jobset-name",
            doc,
            ("metadata", "name"),
            name,
            "does not start with a letter: the JobSet webhook refuses the JobSet, since its Jobs, "
            "named <JobSet>-<replicated job>-<index>, must be DNS-1035 labels",
            fix,
        )
    subdomain = _get(doc.data, ("spec", "network", "subdomain"))
    if isinstance(subdomain, str) and (not DNS_1035_LABEL.fullmatch(subdomain) or len(subdomain) > 63):
        yield checker.finding(
            "error",
            "manifest-jobset-name",
            doc,
            ("spec", "network", "subdomain"),
            subdomain,
            "is not a DNS-1035 label (a letter first, at most 63 characters): the JobSet webhook "
            "refuses it, since it names the JobSet's headless Service",
            "set [rendezvous] service to a name that starts with a letter, and render again",
        )
    replicated = _get(doc.data, ("spec", "replicatedJobs"))
    for i, rj in enumerate(replicated if isinstance(replicated, list) else []):
        rj_name, replicas = _get(rj, ("name",)), _get(rj, ("replicas",))
        replicas = 1 if replicas is _MISSING else replicas
        if not isinstance(rj_name, str) or not isinstance(replicas, int):
            continue
        job = f"{name}-{rj_name}-{max(replicas - 1, 0)}"
        spec = _get(rj, ("template", "spec"))
        mode = _get(spec, ("completionMode",))
        completions = _get(spec, ("completions",))
        if len(job) > 63:
            yield checker.finding(
                "error",
                "manifest-jobset-name",
                doc,
                ("spec", "replicatedJobs", i, "name"),
                rj_name,
                f"makes the Job name {job}, longer than 63 characters: the JobSet webhook refuses the JobSet",
                fix,
            )
        elif mode in (_MISSING, "Indexed") and isinstance(completions, int):
            pod = f"{job}-{max(completions - 1, 0)}"
            if len(pod) + JOBSET_POD_SUFFIX > 63:
                yield checker.finding(
                    "error",
                    "manifest-jobset-name",
                    doc,
                    ("spec", "replicatedJobs", i, "name"),
                    rj_name,
                    f"makes the last pod's name {pod}, {len(pod) + JOBSET_POD_SUFFIX} characters with "
                    f"the {JOBSET_POD_SUFFIX}-character random suffix: the JobSet webhook refuses "
                    "the JobSet (at most 63)",
                    fix,
                )

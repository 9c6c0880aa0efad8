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

import dataclasses
import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol

from nvtrain.findings import Finding, toml_value
from nvtrain.templates.manifest import (
    CONTAINER,
    GPU_RESOURCE,
    JOB_UID_LABEL,
    JOBSET_POD_SUFFIX,
    JOBSET_UID_LABEL,
    NEVER_RETRY,
    POLICY_FILE,
    POLICY_MOUNT,
    SHM_MOUNT,
    keeps_host_copy,
)
from nvtrain.templates.manifest_yaml import MISSING as _MISSING
from nvtrain.templates.manifest_yaml import Doc as _Doc
from nvtrain.templates.manifest_yaml import YamlPath
from nvtrain.templates.manifest_yaml import get as _get
from nvtrain.templates.manifest_yaml import jobset_root as _jobset_root
from nvtrain.templates.scheduling import GROUP_ANNOTATION
from nvtrain.templates.trainer_runtime import NODE

if TYPE_CHECKING:
    from nvtrain.config.schema import Policy
    from nvtrain.findings import Severity

__all__ = ["Checker", "check_references"]

_KUSTOMIZE = 'the configuration of docs/kubernetes.md, "Kustomize" (nvtrain-names.yaml)'

_CONTROLLER_LABELS = (
    "batch.kubernetes.io/",
    "jobset.sigs.k8s.io/",
    "trainer.kubeflow.org/",
    "controller-uid",
    "job-name",
)
"""Label keys that the Job, JobSet and Trainer controllers add to the pods they create: a
selector on them cannot be judged from the template, and is taken to match."""

_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


class Checker(Protocol):
    """What these checks need of ``manifest_checks``' checker: the policy (if any), how to
    re-render, which Jobs are the control pod's, and how to make a finding at a YAML path."""

    @property
    def policy(self) -> Policy | None: ...

    @property
    def rerender(self) -> str: ...

    def finding(
        self, severity: Severity, code: str, doc: _Doc | None, path: YamlPath, value: Any, rule: str, fix: str
    ) -> Finding: ...

    def is_control(self, doc: _Doc) -> bool: ...

    def is_control_replicated(self, doc: _Doc, index: int) -> bool: ...


@dataclasses.dataclass(frozen=True)
class _Pods:
    """The pod template of one Job (a plain Job, or one replicated Job of a JobSet)."""

    doc: _Doc
    job: YamlPath
    """Path of the Job's spec: ``spec`` or ``spec.replicatedJobs[i].template.spec``."""
    control: bool
    """The control pod's Job (``nvtrain control``), not the training pods'."""

    @property
    def jobset(self) -> bool:
        """A replicated Job of a JobSet, or of the JobSet template of a Trainer runtime."""
        return _jobset_root(self.doc.data) is not None

    @property
    def runtime(self) -> bool:
        """The pods of a Trainer runtime, whose training container is ``node``."""
        return self.doc.data.get("kind") in ("ClusterTrainingRuntime", "TrainingRuntime")

    @property
    def container_name(self) -> str:
        """What nvtrain names the training container: ``node`` in a runtime (Trainer's), else ``trainer``."""
        return NODE if self.runtime else CONTAINER

    @property
    def template(self) -> YamlPath:
        return (*self.job, "template")

    @property
    def spec(self) -> YamlPath:
        return (*self.job, "template", "spec")

    def get(self, *path: str | int) -> Any:
        return _get(self.doc.data, path)

    def labels(self) -> dict[str, Any]:
        found = self.get(*self.template, "metadata", "labels")
        return found if isinstance(found, dict) else {}

    def containers(self) -> list[Any]:
        found = self.get(*self.spec, "containers")
        return found if isinstance(found, list) else []

    def count(self) -> int | None:
        """Pods that run at once: ``parallelism`` (default 1) × the JobSet's ``replicas``."""
        parallelism = self.get(*self.job, "parallelism")
        parallelism = 1 if parallelism is _MISSING else parallelism
        replicas: Any = 1
        if self.jobset:
            replicas = self.get(*self.job[:-2], "replicas")
            replicas = 1 if replicas is _MISSING else replicas
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (parallelism, replicas)):
            return None
        return int(parallelism) * int(replicas)

    def what(self) -> str:
        """``the pods of Job x`` / ``the control pod of JobSet y``, for messages."""
        return f"the {'control pod' if self.control else 'training pods'} of {self.doc.label}"


def _pods(checker: Checker, docs: Sequence[_Doc]) -> Iterator[_Pods]:
    for doc in docs:
        kind = doc.data.get("kind")
        if kind == "Job":
            yield _Pods(doc, ("spec",), checker.is_control(doc))
        elif (root := _jobset_root(doc.data)) is not None:
            replicated = _get(doc.data, (*root, "replicatedJobs"))
            for i in range(len(replicated) if isinstance(replicated, list) else 0):
                at: YamlPath = (*root, "replicatedJobs", i, "template", "spec")
                yield _Pods(doc, at, checker.is_control_replicated(doc, i))


def _names(docs: Sequence[_Doc], kind: str) -> set[str]:
    return {
        name
        for d in docs
        if d.data.get("kind") == kind and isinstance(name := _get(d.data, ("metadata", "name")), str)
    }


def check_references(checker: Checker, docs: Sequence[_Doc]) -> Iterator[Finding]:
    """Every broken reference of the manifest ``docs`` (see the module's docstring)."""
    # A Job without a pod template has its shape finding already.
    pods = [p for p in _pods(checker, docs) if isinstance(p.get(*p.spec), dict)]
    configmaps = _names(docs, "ConfigMap")
    groups = _names(docs, "PodGroup")
    for pod in pods:
        yield from _configmap_refs(checker, pod, configmaps)
        yield from _group_ref(checker, pod, groups)
        yield from _failure_policy(checker, pod)
        if not pod.control:
            yield from _training_container(checker, pod)
            yield from _backoff(checker, pod)
    yield from _group_members(checker, docs, pods)
    for doc in docs:
        kind = doc.data.get("kind")
        ours = _get(doc.data, ("metadata", "labels", "app.kubernetes.io/managed-by")) == "nvtrain"
        if kind == "NetworkPolicy" and ours:  # one of the user's own may select what it likes
            yield from _network_policy(checker, doc, pods)
        elif kind == "Service":
            yield from _service(checker, doc, pods)
        elif kind == "PodMonitor" and ours:
            yield from _pod_monitor(checker, doc, pods)
        elif kind == "JobSet":
            yield from _jobset_names(checker, doc)


# -- names: ConfigMap, PodGroup ----------------------------------------------------------------


def _policy_volumes(pod: _Pods) -> set[str]:
    """Names of the volumes that hold the policy: ``policy``, and any mounted at ``/etc/nvtrain``."""
    names = {"policy"}
    for container in pod.containers():
        mounts = _get(container, ("volumeMounts",))
        for mount in mounts if isinstance(mounts, list) else []:
            if _get(mount, ("mountPath",)) == POLICY_MOUNT and isinstance(_get(mount, ("name",)), str):
                names.add(mount["name"])
    return names


def _configmap_refs(checker: Checker, pod: _Pods, configmaps: set[str]) -> Iterator[Finding]:
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
            f"make Kustomize rename it with the ConfigMap: add {_KUSTOMIZE}; or set it to the "
            "ConfigMap's name",
        )


def _group_ref(checker: Checker, pod: _Pods, groups: set[str]) -> Iterator[Finding]:
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
            f"make Kustomize rename it with the PodGroup: add {_KUSTOMIZE}; or set it to the PodGroup's name",
        )


def _group_members(checker: Checker, docs: Sequence[_Doc], pods: Sequence[_Pods]) -> Iterator[Finding]:
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


# -- the pod failure policy --------------------------------------------------------------------


def _failure_policy(checker: Checker, pod: _Pods) -> Iterator[Finding]:
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


def _backoff(checker: Checker, pod: _Pods) -> Iterator[Finding]:
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


# -- the training container ----------------------------------------------------------------------


def _training(pod: _Pods) -> tuple[int, dict[str, Any]] | None:
    """(index, container) of the training container: named ``trainer`` (``node`` in a Trainer
    runtime), else the one that runs ``nvtrain run``, else the first."""
    containers = [(i, c) for i, c in enumerate(pod.containers()) if isinstance(c, dict)]
    for i, c in containers:
        if c.get("name") == pod.container_name:
            return i, c
    for i, c in containers:
        if _nvtrain_run(c) is not None:
            return i, c
    return containers[0] if containers else None


def _words(container: dict[str, Any]) -> list[str]:
    words: list[str] = []
    for key in ("command", "args"):
        items = container.get(key)
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, str):
                continue
            try:
                words += shlex.split(item) if " " in item.strip() else [item]
            except ValueError:
                words += item.split()
    return words


def _nvtrain_run(container: dict[str, Any]) -> str | None:
    """The policy file that ``container`` runs ``nvtrain run`` with (``--policy FILE``, or the
    first ``*.toml`` argument; "" when it cannot be told), or None when it does not run
    ``nvtrain run``."""
    words = _words(container)
    for i in range(len(words) - 1):
        if PurePosixPath(words[i]).name == "nvtrain" and words[i + 1] == "run":
            rest = words[i + 2 :]
            for j, word in enumerate(rest):
                if word == "--policy" and j + 1 < len(rest):
                    return rest[j + 1]
                if word.startswith("--policy="):
                    return word.partition("=")[2]
            return next((w for w in rest if w.endswith(".toml") and not w.startswith("-")), "")
    return None


def _training_container(checker: Checker, pod: _Pods) -> Iterator[Finding]:
    found = _training(pod)
    if found is None:
        return
    index, container = found
    at: YamlPath = (*pod.spec, "containers", index)
    volumes = pod.get(*pod.spec, "volumes")
    volumes = {v.get("name"): v for v in volumes if isinstance(v, dict)} if isinstance(volumes, list) else {}
    mounts = container.get("volumeMounts")
    mounts = [m for m in mounts if isinstance(m, dict)] if isinstance(mounts, list) else []
    for i, mount in enumerate(mounts):
        if mount.get("name") not in volumes:
            yield checker.finding(
                "error",
                "manifest-volume",
                pod.doc,
                (*at, "volumeMounts", i, "name"),
                mount.get("name", _MISSING),
                f"names no volume of the pod (volumes: {', '.join(map(str, volumes)) or 'none'}): "
                "Kubernetes refuses the Job",
                "rename the volume and its mounts together, or render again",
            )
    yield from _command(checker, pod, at, container, volumes, mounts)
    yield from _run_id(checker, pod, at, container)
    yield from _mounts(checker, pod, at, volumes, mounts)
    yield from _gpus(checker, pod, at, container)


def _command(
    checker: Checker,
    pod: _Pods,
    at: YamlPath,
    container: dict[str, Any],
    volumes: dict[Any, Any],
    mounts: list[dict[str, Any]],
) -> Iterator[Finding]:
    """The container runs ``nvtrain run`` on the policy file of a mounted ConfigMap."""
    path = _nvtrain_run(container)
    key = "command" if "command" in container or "args" not in container else "args"
    if path is None:
        yield checker.finding(
            "warning",
            "manifest-command",
            pod.doc,
            (*at, key),
            container.get(key, _MISSING),
            "does not run `nvtrain run`: the pod failure policy, the restarts inside the pod, "
            "the rendezvous through the pods' DNS names and the run id all depend on it, and "
            "its exit codes mean nothing else",
            f'run ["nvtrain", "run", "/etc/nvtrain/{POLICY_FILE}"] (a wrapper script may set up '
            "first and then exec it), or render again",
        )
        return
    files = set()
    for mount in mounts:
        volume = volumes.get(mount.get("name"))
        mount_path = mount.get("mountPath")
        if not isinstance(volume, dict) or "configMap" not in volume or not isinstance(mount_path, str):
            continue
        sub = mount.get("subPath")
        files.add(mount_path if isinstance(sub, str) and sub else f"{mount_path.rstrip('/')}/{POLICY_FILE}")
    if files and path and path not in files:
        yield checker.finding(
            "error",
            "manifest-command",
            pod.doc,
            (*at, key),
            container.get(key),
            f"runs `nvtrain run {path}`, but the policy ConfigMap is mounted at "
            f"{', '.join(sorted(files))}: every pod exits 2 at once (no such policy file), and "
            "the Job fails",
            f"run nvtrain run {sorted(files)[0]}, or render again",
        )


def _run_id(checker: Checker, pod: _Pods, at: YamlPath, container: dict[str, Any]) -> Iterator[Finding]:
    """``NVTRAIN_RUN_ID`` comes from the workload's UID: the same on every pod and every pod
    that replaces one, and a new one for a new workload. Trainer makes a JobSet of each TrainJob,
    so a runtime's pods take the UID of that JobSet."""
    jobset = pod.jobset
    label = JOBSET_UID_LABEL if jobset else JOB_UID_LABEL
    want = f"metadata.labels['{label}']"
    env = container.get("env")
    env = env if isinstance(env, list) else []
    entries = [(i, e) for i, e in enumerate(env) if isinstance(e, dict) and e.get("name") == "NVTRAIN_RUN_ID"]
    p = checker.policy
    if not entries:
        many = p is None or p.rendezvous.nodes > 1
        yield checker.finding(
            "error" if many else "warning",
            "manifest-run-id",
            pod.doc,
            (*at, "env"),
            _MISSING,
            "has no NVTRAIN_RUN_ID: "
            + (
                "a multi-node job needs one run id on every pod, so every pod exits 2 at start "
                "and the Job fails"
                if many
                else "each pod makes up a run id of its own, so a pod that replaces a lost one "
                "starts from step 0 instead of the run's checkpoints"
            ),
            f"add NVTRAIN_RUN_ID from the field {want} (the {'JobSet' if jobset else 'Job'}'s UID), "
            "or render again",
        )
        return
    i, entry = entries[-1]
    field = _get(entry, ("valueFrom", "fieldRef", "fieldPath"))
    accepted = {want} if jobset else {want, "metadata.labels['controller-uid']"}  # the label before 1.27
    if "value" in entry or field in accepted:
        return  # a fixed value is a choice: that run id, on every pod and every new Job
    yield checker.finding(
        "warning",
        "manifest-run-id",
        pod.doc,
        (*at, "env", i),
        field if isinstance(field, str) else entry,
        f"NVTRAIN_RUN_ID does not come from {want}, the {'JobSet' if jobset else 'Job'}'s UID: "
        "pods that do not share it never meet in one rendezvous, and a replaced pod that gets "
        "another one does not resume the run's checkpoints",
        f"take it from the field {want}, or render again",
    )


def _under(path: str, mount: str) -> bool:
    p, m = PurePosixPath(path), PurePosixPath(mount)
    return p == m or m in p.parents


def _mounts(
    checker: Checker, pod: _Pods, at: YamlPath, volumes: dict[Any, Any], mounts: list[dict[str, Any]]
) -> Iterator[Finding]:
    """``[checkpoint] dir`` on a shared volume, and a memory-backed ``/dev/shm``."""
    p = checker.policy
    if p is None:
        return
    where = (*at, "volumeMounts")
    value = [m.get("mountPath") for m in mounts]
    directory = p.checkpoint.dir
    holding = [m for m in mounts if isinstance(m.get("mountPath"), str) and _under(directory, m["mountPath"])]
    if not holding:
        yield checker.finding(
            "error",
            "manifest-mount",
            pod.doc,
            where,
            value,
            f"mounts no volume at [checkpoint] dir = {toml_value(directory)}: the checkpoints go "
            "into the container's own filesystem, are lost with the pod, and the other pods cannot "
            "read them; a replaced pod starts from step 0",
            f"mount the checkpoint PersistentVolumeClaim at {directory}, or render again",
        )
    else:
        volume = volumes.get(max(holding, key=lambda m: len(str(m["mountPath"]))).get("name"))
        if isinstance(volume, dict) and "persistentVolumeClaim" not in volume:
            kind = next((k for k in volume if k != "name"), "?")
            yield checker.finding(
                "warning",
                "manifest-mount",
                pod.doc,
                where,
                value,
                f"[checkpoint] dir = {toml_value(directory)} is on a {kind} volume, not a "
                "PersistentVolumeClaim: unless it is storage that every pod shares, the checkpoints "
                "are lost with the pod and the other pods cannot read them",
                "mount a ReadWriteMany PersistentVolumeClaim there, or render again",
            )
    shm = [m for m in mounts if m.get("mountPath") in (SHM_MOUNT, f"{SHM_MOUNT}/")]
    memory = any(_get(volumes.get(m.get("name")), ("emptyDir", "medium")) == "Memory" for m in shm)
    if not memory:
        copies = " and the host copies of the checkpoint" if keeps_host_copy(p) else ""
        yield checker.finding(
            "warning",
            "manifest-mount",
            pod.doc,
            where,
            value,
            f"mounts no memory-backed emptyDir at {SHM_MOUNT}: the container runtime's default is "
            f"64 MiB, too small for the data-loader workers{copies}, which then fail with bus errors",
            f"mount an emptyDir with medium: Memory at {SHM_MOUNT}, or render again",
        )


def _limit(container: dict[str, Any], name: str) -> Any:
    for key in ("limits", "requests"):
        value = _get(container, ("resources", key, name))
        if value is not _MISSING:
            return value
    return _MISSING


def _gpus(checker: Checker, pod: _Pods, at: YamlPath, container: dict[str, Any]) -> Iterator[Finding]:
    """One GPU per rank: ``nvidia.com/gpu`` equal to a numeric ``[job] nproc_per_node``."""
    p = checker.policy
    if p is None:
        return
    nproc = p.job.nproc_per_node
    if not isinstance(nproc, int) or p.job.backend == "gloo":
        return
    limits = _get(container, ("resources", "limits"))
    if isinstance(limits, dict) and any(str(k).startswith("nvidia.com/mig-") for k in limits):
        return  # MIG slices: a pod's devices are not counted in nvidia.com/gpu
    path: YamlPath = (*at, "resources", "limits", GPU_RESOURCE)
    raw = _limit(container, GPU_RESOURCE)
    try:
        count = int(raw) if isinstance(raw, (int, str)) and not isinstance(raw, bool) else None
    except ValueError:
        count = None
    if raw is _MISSING or count == 0:
        if p.job.backend == "nccl":
            yield checker.finding(
                "error",
                "manifest-gpus",
                pod.doc,
                path,
                raw,
                f'gives the pod no GPU, but [job] backend = "nccl" runs {nproc} ranks of one GPU '
                "each: every rank fails at start",
                f"set {GPU_RESOURCE} to {nproc} (requests and limits), or render again",
            )
        return
    if count is None or count == nproc:
        return
    fewer = count < nproc
    yield checker.finding(
        "error" if fewer else "warning",
        "manifest-gpus",
        pod.doc,
        path,
        raw,
        f"is not [job] nproc_per_node = {nproc}: each rank uses one GPU of its own, "
        + (
            f"so local ranks {count} to {nproc - 1} find no GPU (CUDA's invalid device ordinal) "
            "and the pod fails at start"
            if fewer
            else f"so {count - nproc} GPU{'s' if count - nproc > 1 else ''} of every pod are held "
            "and never used"
        ),
        f"set {GPU_RESOURCE} to {nproc} (requests and limits), or change nproc_per_node and render again",
    )


# -- labels and selectors ------------------------------------------------------------------------


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


def _labels_of(pods: Sequence[_Pods]) -> str:
    shown = {pods[0].doc.label: pods[0].labels()} if pods else {}
    return "; ".join(f"{k}: {toml_value(v)}" for k, v in shown.items())


def _network_policy(checker: Checker, doc: _Doc, pods: Sequence[_Pods]) -> Iterator[Finding]:
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
            f"make Kustomize label the pods too: add {_KUSTOMIZE}; or make the selector match "
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


def _admits_all(rule: Any, pods: Sequence[_Pods]) -> bool:
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


def _service(checker: Checker, doc: _Doc, pods: Sequence[_Pods]) -> Iterator[Finding]:
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


def _pod_monitor(checker: Checker, doc: _Doc, pods: Sequence[_Pods]) -> Iterator[Finding]:
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
        f"make the selector match the pods' labels: add {_KUSTOMIZE}; or render again",
    )


# -- names the JobSet webhook refuses --------------------------------------------------------------


def _jobset_names(checker: Checker, doc: _Doc) -> Iterator[Finding]:
    """What the JobSet validating webhook refuses: names made of the JobSet's name that are not
    DNS-1035 labels (a letter first, at most 63 characters), the pods' with a 6-character suffix."""
    name = _get(doc.data, ("metadata", "name"))
    if not isinstance(name, str):
        return
    fix = (
        "start the JobSet's name with a letter and keep it short (a Kustomize namePrefix adds "
        "to it), or render again"
    )
    if not _DNS_1035.fullmatch(name):
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
    if isinstance(subdomain, str) and (not _DNS_1035.fullmatch(subdomain) or len(subdomain) > 63):
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

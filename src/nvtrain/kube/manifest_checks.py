"""``nvtrain validate --manifest``: check a rendered (or hand-edited) manifest against the policy
and the measured timings.

``nvtrain manifest`` derives the pods' grace period, the number of pods, the rendezvous port,
the Service name and the namespace from the policy, so a freshly rendered manifest always
agrees with it. A manifest edited by hand, or rendered from an older policy, may not: these
checks read every YAML document of the file (a Job or a JobSet, with or without the other
objects) and report, as findings with the file, line and YAML path, where it disagrees with the
policy and where its grace period is shorter than the measured checkpoint write.

With ``[rendezvous] store = "control"`` the manifest holds a second Job, ``<job>-control``, whose
pod runs the rendezvous store: it is told apart from the training Job (by its name, or by its
``nvtrain control`` command when there is no valid policy to name it), checked for what gives it
its DNS name and what it runs, and never taken for the workload. In a JobSet it is the
replicated job ``control`` (``--jobset``), told apart and checked the same way, and exempt from
what applies to the training pods only (one pod per node, pod names holding ``[job] name``, the
grace period against the checkpoint write).

A Kubeflow Trainer runtime (``nvtrain manifest --trainer-runtime``: ``ClusterTrainingRuntime``,
``TrainingRuntime``) is checked as the JobSet that Trainer makes of it for each TrainJob (its
``spec.template.spec``), less what the TrainJob names (the pods' names and the Service come
from the TrainJob's name, which the file does not hold), plus what Trainer takes from the
runtime (``Checker.runtime``): ``mlPolicy.numNodes``, no framework policy, no fixed subdomain,
the trainer's ancestor label and its container ``node``.

Renames after rendering (Kustomize ``namePrefix``, ``nameSuffix``, ``namespace``) are told apart
by whether the pods can still find each other: the pods take their peers' names from their own
hostname and DNS name (``launcher.identity``), so a Job whose name still holds ``[job] name``, a
``subdomain`` that names a Service of the file, and one namespace for every object work (info
``manifest-renamed``); a ``subdomain`` naming no Service of the file, a Job name without
``[job] name``, or objects in different namespaces cannot, and are errors.

Every reference that the pods depend on (ConfigMap, PodGroup, the selectors of the Service,
NetworkPolicy and PodMonitor, the pod failure policy's container, the command, the run id, the
checkpoint and ``/dev/shm`` mounts, the GPU count, the names the JobSet webhook accepts) is
checked by ``manifest_refs``, after whatever edit made it; what the job needs of the set of
objects and of each pod template (objects removed, queue labels, the policy mount, ``/dev/shm``
against the memory limit, the metrics port, host network, Pod Security) and the rules the API
server enforces by ``edit_checks``.

Without a policy file, ``validate_manifest`` checks the policy in the manifest's ConfigMap (the
one the pods run), and the NVRx version the manifest was rendered for (``nvtrain manifest --nvrx``,
the pod annotation ``nvtrain.dev/nvrx-version``) is the version its rules are checked against.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from nvtrain.config.load import read_source
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding, toml_value
from nvtrain.kube.edit_checks import edit_checks, monitoring_elsewhere
from nvtrain.kube.manifest_checker import KUBERNETES_DEFAULT_GRACE
from nvtrain.kube.manifest_refs import check_references
from nvtrain.kube.monitoring_checks import check_monitoring
from nvtrain.kube.nvrx_pin import NVRX_ANNOTATION
from nvtrain.kube.objects import POLICY_FILE
from nvtrain.kube.workload_checks import Checker
from nvtrain.kube.yaml_positions import MISSING as _MISSING
from nvtrain.kube.yaml_positions import Doc as _Doc
from nvtrain.kube.yaml_positions import YamlPath, read_manifest
from nvtrain.kube.yaml_positions import get as _get
from nvtrain.kube.yaml_positions import jobset_root as _jobset_root
from nvtrain.nvrx import NvrxVersion

if TYPE_CHECKING:
    from nvtrain.config.timings import Timings
    from nvtrain.config.validation import Validation

__all__ = ["KUBERNETES_DEFAULT_GRACE", "check_manifest", "validate_manifest"]


def check_manifest(
    path: Path,
    policy: Policy | None = None,
    *,
    policy_text: str | None = None,
    policy_source: str = "POLICY",
    timings: Timings | None = None,
) -> list[Finding]:
    """Every finding about the manifest at ``path``; never raises for bad input.

    With ``policy``: where the manifest disagrees with what ``nvtrain manifest`` renders from it
    (pods, rendezvous port, Service, namespace, grace period, the control Job of
    ``[rendezvous] store = "control"``; with ``policy_text`` also the policy in the ConfigMap),
    and where a rename leaves the pods unable to find each other.
    With ``timings``: grace periods of the training pods shorter than the measured checkpoint
    write plus ``GRACE_MARGIN``."""
    docs, error = read_manifest(path)
    if error is not None:
        return [error]
    return _check(str(path), docs, policy, policy_text, policy_source, timings)


def _pod_templates(doc: _Doc) -> Iterator[YamlPath]:
    """Paths of the pod templates of a Job or JobSet."""
    root = _jobset_root(doc.data)
    if doc.data.get("kind") == "Job":
        yield ("spec", "template")
    elif root is not None:
        replicated = _get(doc.data, (*root, "replicatedJobs"))
        for i in range(len(replicated) if isinstance(replicated, list) else 0):
            yield (*root, "replicatedJobs", i, "template", "spec", "template")


def _check(
    source: str,
    docs: Sequence[_Doc],
    policy: Policy | None,
    policy_text: str | None,
    policy_source: str,
    timings: Timings | None,
) -> list[Finding]:
    jobset = any(d.data.get("kind") == "JobSet" for d in docs)
    scopes = {"ClusterTrainingRuntime": "cluster", "TrainingRuntime": "namespaced"}
    runtime = next((scopes[k] for d in docs if (k := str(d.data.get("kind"))) in scopes), None)
    services = [
        name
        for d in docs
        if d.data.get("kind") == "Service" and isinstance(name := _get(d.data, ("metadata", "name")), str)
    ]
    probe = Checker(source, policy, policy_text, policy_source, timings, jobset)
    workloads = [
        d
        for d in docs
        if _jobset_root(d.data) is not None or (d.data.get("kind") == "Job" and not probe.is_control(d))
    ]
    subdomains = [
        found
        for d in workloads
        if d.data.get("kind") == "Job"
        and isinstance(found := _get(d.data, ("spec", "template", "spec", "subdomain")), str)
    ]
    checker = Checker(
        source, policy, policy_text, policy_source, timings, jobset, services, subdomains, runtime
    )
    findings = [f for doc in docs for f in checker.document(doc)]
    findings += checker.missing_control(docs)
    findings += check_references(checker, docs)
    findings += edit_checks(checker, docs)
    findings += _namespaces(checker, docs, workloads)
    findings += check_monitoring(checker, docs)
    if not workloads:
        only_control = " of training pods" if any(d.data.get("kind") == "Job" for d in docs) else ""
        findings.append(
            Finding(
                "error",
                "manifest-no-job",
                "",
                None,
                f"holds no Job or JobSet{only_control} ({_kinds(docs)}): there is no pod template to check",
                "give the file that `nvtrain manifest` writes (its Job or JobSet is the last document)",
                file=source,
            )
        )
    return sorted(findings, key=Finding.sort_key)


def _namespaces(checker: Checker, docs: Sequence[_Doc], workloads: Sequence[_Doc]) -> Iterator[Finding]:
    """An error on every object whose namespace is not the one of most objects (on a tie, the
    workload's): the pods' DNS names live in their own namespace, and a pod mounts only a
    ConfigMap of its own namespace. Objects with no namespace go where they are applied, and
    the monitoring objects that may live elsewhere (``edit_checks.monitoring_elsewhere``) are
    left out."""
    written = [
        (d, ns)
        for d in docs
        if isinstance(ns := _get(d.data, ("metadata", "namespace")), str) and not monitoring_elsewhere(d)
    ]
    counts = collections.Counter(ns for _, ns in written)
    if len(counts) < 2:
        return
    own = {ns for d, ns in written if any(d is w for w in workloads)}
    usual = max(counts, key=lambda ns: (counts[ns], ns in own))
    for doc, ns in written:
        if ns != usual:
            yield checker.finding(
                "error",
                "manifest-namespace",
                doc,
                ("metadata", "namespace"),
                ns,
                f"is not the namespace of the other objects ({toml_value(usual)}): the training "
                "pods would not find a Service, ConfigMap or control pod of another namespace",
                "put every object of the file in one namespace (a Kustomize `namespace:` does), "
                "or render them again",
            )


def _kinds(docs: Sequence[_Doc]) -> str:
    return "objects: " + ", ".join(d.label for d in docs) if docs else "no objects"


def _recorded_nvrx(
    source: str, docs: Sequence[_Doc], wanted: NvrxVersion | None
) -> tuple[NvrxVersion | None, list[Finding]]:
    """The NVRx version that ``nvtrain manifest --nvrx`` recorded in the training pods'
    annotation ``NVRX_ANNOTATION``, or None; an error for a value that is not a version, and a
    warning when ``wanted`` (``--nvrx``) is another version."""
    checker = Checker(source, None, None, "POLICY", None, False)
    found: list[NvrxVersion] = []
    problems: list[Finding] = []
    for doc in docs:
        if doc.data.get("kind") == "Job" and checker.is_control(doc):
            continue
        for template in _pod_templates(doc):
            path = (*template, "metadata", "annotations", NVRX_ANNOTATION)
            value = _get(doc.data, path)
            if value is _MISSING:
                continue
            try:
                if not isinstance(value, str):
                    raise ValueError(value)
                version = NvrxVersion.parse(value)
            except ValueError:
                problems.append(
                    checker.finding(
                        "error",
                        "manifest-nvrx",
                        doc,
                        path,
                        value,
                        "is not an NVRx version: it says which NVRx the training image has, and "
                        "the policy is checked against it",
                        "render again with `nvtrain manifest POLICY --nvrx VERSION` (the "
                        "NVRX_VERSION of the image's Dockerfile, e.g. 0.7.0)",
                    )
                )
                continue
            found.append(version)
            if wanted is not None and wanted != version:
                problems.append(
                    checker.finding(
                        "warning",
                        "manifest-nvrx",
                        doc,
                        path,
                        value,
                        f"the manifest was rendered for NVRx {version}, but --nvrx {wanted} was "
                        "checked: the pods run the policy with the NVRx of their image",
                        f"check with --nvrx {version}, or render again with --nvrx {wanted} if the "
                        "image has that version",
                    )
                )
    return (found[0] if found else None), problems


def _embedded_policy(docs: Sequence[_Doc]) -> tuple[str, str] | None:
    """(ConfigMap name, text) of the policy the training pods mount: the ConfigMap named by a
    workload's ``policy`` volume, else the only ConfigMap holding ``policy.toml``."""
    maps = {
        name: text
        for d in docs
        if d.data.get("kind") == "ConfigMap"
        and isinstance(name := _get(d.data, ("metadata", "name")), str)
        and isinstance(text := _get(d.data, ("data", POLICY_FILE)), str)
    }
    for doc in docs:
        for template in _pod_templates(doc):
            volumes = _get(doc.data, (*template, "spec", "volumes"))
            for volume in volumes if isinstance(volumes, list) else []:
                name = _get(volume, ("configMap", "name"))
                if isinstance(name, str) and name in maps:
                    return name, maps[name]
    return next(iter(maps.items())) if len(maps) == 1 else None


def validate_manifest(
    policy: Path | None,
    manifest: Path,
    *,
    nvrx: NvrxVersion | None = None,
    timings: Timings | None = None,
    timings_findings: Sequence[Finding] = (),
) -> Validation:
    """``nvtrain validate [POLICY] --manifest FILE``: the policy, then the manifest against it.

    The policy is the file ``policy`` or, without it, the one in the manifest's ConfigMap (the
    built-in demo policy when the manifest holds none). Its NVRx rules are checked for ``nvrx``
    (``--nvrx``), else for the version the manifest records (``nvtrain manifest --nvrx``), else
    for the installed one. The manifest's findings come after the policy's; an invalid policy is
    left out of the comparison."""
    from nvtrain.config.demo import demo_policy_text
    from nvtrain.config.validation import validate_file, validate_source

    docs, error = read_manifest(manifest)
    recorded, problems = _recorded_nvrx(str(manifest), docs, nvrx)
    version: NvrxVersion | Literal["installed"] = nvrx or recorded or "installed"
    embedded = _embedded_policy(docs) if policy is None else None
    if embedded is not None:
        name, text = embedded
        result = validate_source(
            text,
            f"{manifest} (ConfigMap {name})",
            nvrx=version,
            timings=timings,
            timings_findings=timings_findings,
        )
    else:
        result = validate_file(policy, nvrx=version, timings=timings, timings_findings=timings_findings)
        text = None
        if result.ok:
            raw = demo_policy_text().encode("utf-8") if policy is None else read_source(policy)[0]
            text = raw.decode("utf-8", errors="replace") if raw is not None else None
    if error is not None:
        found = [error]
    else:
        found = _check(
            str(manifest),
            docs,
            result.policy if result.ok else None,
            text if result.ok else None,
            str(policy) if policy is not None else "POLICY",
            timings,
        )
    findings = [*result.findings, *sorted([*problems, *found], key=Finding.sort_key)]
    return dataclasses.replace(result, findings=findings)

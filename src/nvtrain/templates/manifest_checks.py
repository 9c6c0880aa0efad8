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
runtime (``_Checker.runtime``): ``mlPolicy.numNodes``, no framework policy, no fixed subdomain,
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
checked by ``manifest_refs``, after whatever edit made it.

Without a policy file, ``validate_manifest`` checks the policy in the manifest's ConfigMap (the
one the pods run), and the NVRx version the manifest was rendered for (``nvtrain manifest --nvrx``,
the pod annotation ``nvtrain.dev/nvrx-version``) is the version its rules are checked against.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from nvtrain.config.checks import MARGIN
from nvtrain.config.duration import format_duration
from nvtrain.config.load import read_source
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding, Severity, toml_value
from nvtrain.launcher.dns import CONTROL_SUFFIX, control_name
from nvtrain.nvrx import NvrxVersion
from nvtrain.templates.manifest import (
    CONTROL_CONTAINER,
    GRACE_MARGIN,
    POLICY_FILE,
    control_job_name,
    grace_period,
    has_control_job,
    selector,
)
from nvtrain.templates.manifest_refs import check_references
from nvtrain.templates.manifest_yaml import MISSING as _MISSING
from nvtrain.templates.manifest_yaml import TRAINER_RUNTIMES as _TRAINER_RUNTIMES
from nvtrain.templates.manifest_yaml import Doc as _Doc
from nvtrain.templates.manifest_yaml import YamlPath
from nvtrain.templates.manifest_yaml import get as _get
from nvtrain.templates.manifest_yaml import jobset_root as _jobset_root
from nvtrain.templates.manifest_yaml import position as _position
from nvtrain.templates.manifest_yaml import yaml_path as yaml_path
from nvtrain.templates.nvrx_pin import NVRX_ANNOTATION
from nvtrain.templates.trainer_runtime import ANCESTOR_LABEL, NODE

if TYPE_CHECKING:
    from nvtrain.config.timings import Timings
    from nvtrain.config.validation import Validation

__all__ = ["KUBERNETES_DEFAULT_GRACE", "check_manifest", "validate_manifest"]

KUBERNETES_DEFAULT_GRACE = 30
"""``terminationGracePeriodSeconds`` when a pod spec leaves it out."""

_HOSTNAME_LIMIT = 63
"""A pod's hostname is a DNS label: at most 63 characters."""


def _runs_control(container: Any) -> bool:
    """Whether ``container`` runs ``nvtrain control ...``."""
    command = container.get("command") if isinstance(container, dict) else None
    return isinstance(command, list) and command[:2] == ["nvtrain", "control"]


class _Checker:
    def __init__(
        self,
        source: str,
        policy: Policy | None,
        policy_text: str | None,
        policy_source: str,
        timings: Timings | None,
        jobset: bool,
        services: Sequence[str] = (),
        subdomains: Sequence[str] = (),
        runtime: str | None = None,
    ) -> None:
        self.source = source
        self.policy = policy
        self.policy_text = policy_text
        self.timings = timings
        self.services = frozenset(services)
        """Names of the Services in the file (none: the file may be one part of a larger set)."""
        self.subdomains = tuple(subdomains)
        """The training pods' subdomains (a renamed Service is known by them)."""
        flag = f" --trainer-runtime {runtime}" if runtime else " --jobset" if jobset else ""
        self.rerender = (
            "re-render it, with the options used before (e.g. --image): "
            f"`nvtrain manifest {policy_source}{flag} -o {source}`"
        )

    def finding(
        self, severity: Severity, code: str, doc: _Doc | None, path: YamlPath, value: Any, rule: str, fix: str
    ) -> Finding:
        line, column = _position(doc.node, path) if doc is not None else (None, None)
        shown = None if value is _MISSING else toml_value(value)
        return Finding(
            severity,
            code,
            doc.label if doc is not None else "",
            yaml_path(path) or None,
            rule,
            fix,
            shown,
            file=self.source,
            line=line,
            column=column,
        )

    def mismatch(
        self, doc: _Doc, path: YamlPath, found: Any, want: Any, source: str, why: str
    ) -> Iterator[Finding]:
        """A warning when ``found`` (the manifest's value) is not ``want`` (what nvtrain renders
        from the policy key ``source``); ``why`` says what goes wrong when they differ."""
        if found == want and type(found) is type(want):
            return
        shown = "is not set" if found is _MISSING else "differs from the policy"
        yield self.finding(
            "warning",
            "manifest-mismatch",
            doc,
            path,
            found,
            f"{shown}: nvtrain renders {toml_value(want)} from {source}; {why}",
            self.rerender,
        )

    def renamed(self, doc: _Doc, path: YamlPath, found: Any, want: str, source: str) -> Iterator[Finding]:
        """An info when ``found`` differs from ``want`` in a way that the pods survive: they take
        their peers' names from their own hostname and DNS name, not from the policy."""
        if found == want:
            return
        yield self.finding(
            "info",
            "manifest-renamed",
            doc,
            path,
            found,
            f"differs from the policy ({source} = {toml_value(want)}), as after a Kustomize "
            "namePrefix, nameSuffix or namespace: the pods find their peers through their own "
            "hostname and DNS name, so this works",
            "nothing to do; render again with the new name in the policy to make them agree",
        )

    def dialled(self) -> set[str]:
        """Names of the Services whose DNS names the pods use: the policy's, and the ones the
        training pods' subdomains name."""
        names = set(self.subdomains)
        if self.policy is not None:
            names.add(self.policy.service)
        return names

    def subdomain(self, doc: _Doc, pod: YamlPath, found: Any, why: str) -> Iterator[Finding]:
        """The pod template's ``subdomain`` at ``pod``: an error when it names no Service of a
        file that has Services, an info when it names a renamed one, else compared with the
        policy."""
        p = self.policy
        assert p is not None
        path = (*pod, "subdomain")
        if isinstance(found, str) and self.services and found not in self.services:
            services = ", ".join(sorted(self.services))
            yield self.finding(
                "error",
                "manifest-subdomain",
                doc,
                path,
                found,
                f"names no Service of this file (Services: {services}): the pods' DNS names "
                f"<hostname>.{found}... never resolve, so every pod waits [rendezvous] dns_timeout "
                "and exits 3. A Kustomize namePrefix or nameSuffix renames the Service but not "
                "this field",
                "make Kustomize rename it with the Service: add the nameReference configuration "
                'of docs/kubernetes.md, "Kustomize", or set it to the Service\'s name',
            )
        elif isinstance(found, str) and found in self.services:
            yield from self.renamed(doc, path, found, p.service, "[rendezvous] service")
        else:
            yield from self.mismatch(doc, path, found, p.service, "[rendezvous] service", why)

    def job_name(self, doc: _Doc, path: YamlPath, base: Any, what: str) -> Iterator[Finding]:
        """An error when ``base``, what the pods' hostnames are made of (``<base>-<index>``), does
        not hold ``[job] name``: the pods would not know their own hostnames for the job's."""
        p = self.policy
        if p is None or not isinstance(base, str):
            return
        last = f"{base}-{p.rendezvous.nodes - 1}"
        if p.job.name in base and len(last) > _HOSTNAME_LIMIT:
            yield self.finding(
                "error",
                "manifest-job-name",
                doc,
                path,
                _get(doc.data, path),
                f"{what} {base}-<index>, and the last pod's hostname {last} is longer than "
                f"{_HOSTNAME_LIMIT} characters, which Kubernetes does not allow: that pod is never "
                "created, and the others wait for it",
                "use a shorter prefix or suffix, or a shorter [job] name",
            )
        if p.job.name in base:
            return
        yield self.finding(
            "error",
            "manifest-job-name",
            doc,
            path,
            _get(doc.data, path),
            f"{what} {base}-<index>, which does not hold [job] name = {toml_value(p.job.name)}: "
            f"nvtrain takes pod 0's name from a hostname only when it holds the job name, so the "
            f"pods dial {p.job.name}-0, which does not exist, and exit 3",
            "keep the job name in the Job's name (a Kustomize namePrefix or nameSuffix does), "
            f"or set [job] name to the new name and {self.rerender}",
        )

    # -- one document ---------------------------------------------------------------------------

    def document(self, doc: _Doc) -> Iterator[Finding]:
        kind = doc.data.get("kind")
        p = self.policy
        namespace = _get(doc.data, ("metadata", "namespace"))
        workload = kind in ("JobSet", *_TRAINER_RUNTIMES) or (kind == "Job" and not self.is_control(doc))
        if p is not None and namespace is not _MISSING and workload:
            # Said once, on the workload: an object in another namespace is an error of its own.
            yield from self.renamed(
                doc,
                ("metadata", "namespace"),
                namespace,
                p.rendezvous.namespace,
                "[rendezvous] namespace",
            )
        if kind == "Job" and self.is_control(doc):
            yield from self.control_job(doc)
        elif kind == "Job":
            yield from self.job_name(
                doc, ("metadata", "name"), _get(doc.data, ("metadata", "name")), "the pods are named"
            )
            yield from self.job_spec(doc, ("spec",))
        elif kind == "JobSet":
            yield from self.jobset(doc)
        elif kind in _TRAINER_RUNTIMES:
            yield from self.runtime(doc)
            yield from self.jobset(doc)
        elif kind == "Service" and p is not None and _get(doc.data, ("metadata", "name")) in self.dialled():
            ports = _get(doc.data, ("spec", "ports"))
            for i, port in enumerate(ports if isinstance(ports, list) else []):
                if isinstance(port, dict) and port.get("name") == "rendezvous":
                    for key in ("port", "targetPort"):
                        yield from self.mismatch(
                            doc,
                            ("spec", "ports", i, key),
                            port.get(key, _MISSING),
                            p.rendezvous.port,
                            "[rendezvous] port",
                            "the rendezvous store on pod 0 listens on the policy's port",
                        )
        elif kind == "ConfigMap" and p is not None and self.policy_text is not None:
            text = _get(doc.data, ("data", POLICY_FILE))
            if isinstance(text, str) and text != self.policy_text:
                yield self.finding(
                    "warning",
                    "manifest-mismatch",
                    doc,
                    ("data", POLICY_FILE),
                    text,
                    "is not the text of the policy being validated: the pods would run with the "
                    "policy in this ConfigMap, not with the one checked here",
                    self.rerender,
                )

    def jobset(self, doc: _Doc) -> Iterator[Finding]:
        """A JobSet, or the JobSet template of a Trainer runtime (``runtime`` has its own
        checks): its replicated jobs, the training pods' and the control pod's."""
        p = self.policy
        root = _jobset_root(doc.data) or ("spec",)
        runtime = doc.data.get("kind") in _TRAINER_RUNTIMES
        if p is not None and not runtime:
            yield from self.mismatch(
                doc,
                ("spec", "network", "subdomain"),
                _get(doc.data, ("spec", "network", "subdomain")),
                p.service,
                "[rendezvous] service",
                "the pods dial pod 0 as <name>-0.<service>, and JobSet names the headless Service "
                "after this subdomain",
            )
        replicated = _get(doc.data, (*root, "replicatedJobs"))
        if not isinstance(replicated, list) or not replicated:
            yield self.shape(doc, (*root, "replicatedJobs"), "has no replicated Job (a non-empty list)")
            return
        jobset_name = _get(doc.data, ("metadata", "name"))
        controls = [i for i in range(len(replicated)) if self.is_control_replicated(doc, i)]
        if len(controls) == len(replicated):
            yield self.shape(
                doc,
                (*root, "replicatedJobs"),
                "has no replicated job of training pods, only the control pod's (`nvtrain control`)",
            )
        for i in range(len(replicated)):
            at: YamlPath = (*root, "replicatedJobs", i)
            if i in controls:
                yield from self.control_replicated(doc, at)
                continue
            rj_name = _get(doc.data, (*at, "name"))
            # A runtime's pods are named after each TrainJob, which this file does not hold.
            if isinstance(jobset_name, str) and isinstance(rj_name, str) and not runtime:
                yield from self.job_name(
                    doc,
                    ("metadata", "name"),
                    f"{jobset_name}-{rj_name}-0",
                    f"JobSet names the pods of replicated job {rj_name!r}",
                )
            if p is not None:
                replicas = _get(doc.data, (*at, "replicas"))
                yield from self.mismatch(
                    doc,
                    (*at, "replicas"),
                    1 if replicas is _MISSING else replicas,  # JobSet's default
                    1,
                    f"[rendezvous] nodes = {p.rendezvous.nodes} (one Job with a pod per node)",
                    f"the pods of further replicas would never join the rendezvous of pod {p.job.name}-0",
                )
            yield from self.job_spec(doc, (*at, "template", "spec"))
        if p is not None and has_control_job(p) and not controls and runtime:
            yield self.finding(
                "warning",
                "manifest-mismatch",
                doc,
                (*root, "replicatedJobs"),
                _MISSING,
                '[rendezvous] store = "control" runs the rendezvous store in a pod of its own, '
                f"which a Trainer runtime does not hold: the training pods wait for {control_name(p)} "
                "to resolve and exit 3 when [rendezvous] dns_timeout has passed",
                'set store = "pod0" in [rendezvous] of the policy and render the runtime again, or '
                "render a Job or a JobSet instead",
            )
        elif p is not None and has_control_job(p) and not controls:
            yield self.finding(
                "warning",
                "manifest-mismatch",
                doc,
                ("spec", "replicatedJobs"),
                _MISSING,
                f"has no replicated job {CONTROL_SUFFIX!r} for the control pod {control_job_name(p)}: "
                '[rendezvous] store = "control" runs the rendezvous store in that pod: the training '
                f"pods wait for {control_name(p)} to resolve and exit 3 when [rendezvous] "
                "dns_timeout has passed",
                self.rerender,
            )

    def runtime(self, doc: _Doc) -> Iterator[Finding]:
        """What Kubeflow Trainer takes from a runtime (``--trainer-runtime``): the node count of
        ``mlPolicy``, no framework policy, the replicated job of the trainer (its ancestor
        label) with the container ``node``, and no fixed subdomain."""
        root = _jobset_root(doc.data) or ("spec",)
        p = self.policy
        if p is not None:
            yield from self.mismatch(
                doc,
                ("spec", "mlPolicy", "numNodes"),
                _get(doc.data, ("spec", "mlPolicy", "numNodes")),
                p.rendezvous.nodes,
                "[rendezvous] nodes",
                "Trainer makes that many pods of the trainer's replicated job, and the rendezvous "
                f"waits for {p.rendezvous.nodes}. A TrainJob's spec.trainer.numNodes overrides it: "
                "leave it out of the TrainJobs of this runtime",
            )
        for framework in ("torch", "mpi"):
            path: YamlPath = ("spec", "mlPolicy", framework)
            if _get(doc.data, path) is not _MISSING:
                yield self.finding(
                    "warning",
                    "manifest-mismatch",
                    doc,
                    path,
                    _get(doc.data, path),
                    f"makes Trainer configure the pods for {framework} (its PET_* variables, "
                    "numProcPerNode, ports), which nvtrain does not read: nvtrain is the launcher, "
                    "and its policy sets the ranks per node",
                    f"delete mlPolicy.{framework}, or {self.rerender}",
                )
        subdomain = (*root, "network", "subdomain")
        if _get(doc.data, subdomain) is not _MISSING:
            yield self.finding(
                "warning",
                "manifest-mismatch",
                doc,
                subdomain,
                _get(doc.data, subdomain),
                "gives every TrainJob of this runtime one headless Service name: the JobSet of a "
                "second TrainJob in the namespace cannot create it, and its pods get no DNS names. "
                "Without it JobSet names the Service after each TrainJob, and the pods find their "
                "peers from their own names",
                f"delete network.subdomain, or {self.rerender}",
            )
        replicated = _get(doc.data, (*root, "replicatedJobs"))
        replicated = replicated if isinstance(replicated, list) else []
        marked = [
            i
            for i, rj in enumerate(replicated)
            if _get(rj, ("template", "metadata", "labels", ANCESTOR_LABEL)) == "trainer"
        ]
        if replicated and not marked:
            yield self.finding(
                "warning",
                "manifest-mismatch",
                doc,
                (*root, "replicatedJobs", 0, "template", "metadata", "labels"),
                _get(doc.data, (*root, "replicatedJobs", 0, "template", "metadata", "labels")),
                f"no replicated job has the label {ANCESTOR_LABEL}: trainer, by which Trainer finds "
                "the trainer's Job: a TrainJob's numNodes, image, env and resourcesPerNode apply "
                "to no pod",
                f"label the training pods' replicated job {ANCESTOR_LABEL}: trainer, or {self.rerender}",
            )
        for i in marked:
            pod: YamlPath = (*root, "replicatedJobs", i, "template", "spec", "template", "spec")
            containers = _get(doc.data, (*pod, "containers"))
            names = [_get(c, ("name",)) for c in containers] if isinstance(containers, list) else []
            if names and NODE not in names:
                yield self.finding(
                    "warning",
                    "manifest-mismatch",
                    doc,
                    (*pod, "containers", 0, "name"),
                    names[0],
                    f"no container of the trainer's pods is named {NODE!r}: Trainer applies a "
                    "TrainJob's image, env and resourcesPerNode to that container only, so they "
                    "change nothing",
                    f"name the training container {NODE!r} (and the pod failure policy's "
                    f"containerName with it), or {self.rerender}",
                )

    def job_spec(self, doc: _Doc, at: YamlPath) -> Iterator[Finding]:
        p = self.policy
        if p is not None:
            nodes = p.rendezvous.nodes
            for key in ("parallelism", "completions"):
                found = _get(doc.data, (*at, key))
                if key == "parallelism" and found is _MISSING:
                    found = 1  # Kubernetes' default
                yield from self.mismatch(
                    doc,
                    (*at, key),
                    found,
                    nodes,
                    "[rendezvous] nodes",
                    f"the rendezvous waits for {nodes} node{'s' if nodes != 1 else ''}, one pod each",
                )
        pod = (*at, "template", "spec")
        spec = _get(doc.data, pod)
        if not isinstance(spec, dict):
            yield self.shape(doc, pod, "has no pod template (a mapping)")
            return
        yield from self.grace(doc, (*pod, "terminationGracePeriodSeconds"))
        if p is None:
            return
        if doc.data.get("kind") in _TRAINER_RUNTIMES:
            pass  # JobSet names the subdomain after the JobSet, that is after each TrainJob
        elif doc.data.get("kind") == "JobSet":  # JobSet sets the pods' subdomain itself
            yield from self.mismatch(
                doc,
                (*pod, "subdomain"),
                spec.get("subdomain", _MISSING),
                p.service,
                "[rendezvous] service",
                "the pods dial pod 0 as <name>-0.<service>, a name that exists only with this subdomain",
            )
        else:
            yield from self.subdomain(
                doc,
                pod,
                spec.get("subdomain", _MISSING),
                "the pods dial pod 0 as <name>-0.<service>, a name that exists only with this subdomain",
            )
        yield from self.ports(doc, pod, spec, "the rendezvous store on pod 0 listens on the policy's port")

    def ports(self, doc: _Doc, pod: YamlPath, spec: dict[str, Any], why: str) -> Iterator[Finding]:
        """The ``rendezvous`` container ports of the pod ``spec`` at ``pod``."""
        assert self.policy is not None
        containers = spec.get("containers")
        for c, container in enumerate(containers if isinstance(containers, list) else []):
            ports = container.get("ports") if isinstance(container, dict) else None
            for i, port in enumerate(ports if isinstance(ports, list) else []):
                if isinstance(port, dict) and port.get("name") == "rendezvous":
                    yield from self.mismatch(
                        doc,
                        (*pod, "containers", c, "ports", i, "containerPort"),
                        port.get("containerPort", _MISSING),
                        self.policy.rendezvous.port,
                        "[rendezvous] port",
                        why,
                    )

    # -- the control Job ([rendezvous] store = "control") -------------------------------------

    def is_control(self, doc: _Doc) -> bool:
        """A Job named ``<job>-control``, or, whatever its name, one whose pod runs
        ``nvtrain control``: the store's Job, not the training pods'."""
        p = self.policy
        if p is not None and _get(doc.data, ("metadata", "name")) == control_job_name(p):
            return True
        containers = _get(doc.data, ("spec", "template", "spec", "containers"))
        return isinstance(containers, list) and any(_runs_control(c) for c in containers)

    def is_control_replicated(self, doc: _Doc, index: int) -> bool:
        """Replicated job ``index`` of a JobSet is the control pod's: it is named ``control``
        and the policy has the control store (with ``store = "pod0"`` the training pods'
        replicated job may have that name), or, whatever its name, its pod runs ``nvtrain control``."""
        p = self.policy
        at: YamlPath = (*(_jobset_root(doc.data) or ("spec",)), "replicatedJobs", index)
        if p is not None and has_control_job(p) and _get(doc.data, (*at, "name")) == CONTROL_SUFFIX:
            return True
        containers = _get(doc.data, (*at, "template", "spec", "template", "spec", "containers"))
        return isinstance(containers, list) and any(_runs_control(c) for c in containers)

    def control_job(self, doc: _Doc) -> Iterator[Finding]:
        """The plain control Job (``nvtrain manifest`` without ``--jobset``)."""
        yield from self.control_pod(doc, ("spec",), ("metadata", "name"), jobset=False)

    def control_replicated(self, doc: _Doc, at: YamlPath) -> Iterator[Finding]:
        """The control replicated job of a JobSet at ``at``: one replica, then the checks of the
        control Job. Not the training pods' checks: it has one pod whatever the node count, and
        its pod's hostname is its own (``<job>-control``), not one that JobSet makes of names."""
        p = self.policy
        if p is not None and has_control_job(p):
            replicas = _get(doc.data, (*at, "replicas"))
            yield from self.mismatch(
                doc,
                (*at, "replicas"),
                1 if replicas is _MISSING else replicas,  # JobSet's default
                1,
                '[rendezvous] store = "control" (one control pod)',
                f"the pod of every replica would be {control_job_name(p)}, each with a rendezvous "
                "store of its own, and the training pods would not all meet in the same one",
            )
        yield from self.control_pod(doc, (*at, "template", "spec"), (*at, "name"), jobset=True)

    def control_pod(self, doc: _Doc, job: YamlPath, name: YamlPath, *, jobset: bool) -> Iterator[Finding]:
        """The control Job whose spec is at ``job`` (named at ``name``) against the policy. It
        saves no checkpoint, so its grace period is not compared with the timings; without a
        valid policy there is nothing else to compare."""
        p = self.policy
        if p is None:
            return
        r = p.rendezvous
        what = "replicated job" if jobset else "Job"
        if not has_control_job(p):
            yield self.finding(
                "warning",
                "manifest-mismatch",
                doc,
                name,
                _get(doc.data, name),
                f"is a control {what}, which nvtrain renders only with [rendezvous] store = "
                f'"control" and 2 or more nodes (the policy has store = "{r.store}", nodes = '
                f"{r.nodes}): the training pods never dial its store, and its pod only waits",
                f"delete this {what} from the {'JobSet' if jobset else 'file'}, or {self.rerender}",
            )
            return
        dns = (
            f"the training pods dial the rendezvous store at {control_name(p)}, a name that the "
            "control pod has only with this hostname and subdomain"
        )
        mode = _get(doc.data, (*job, "completionMode"))
        yield from self.mismatch(
            doc,
            (*job, "completionMode"),
            "NonIndexed" if mode is _MISSING and not jobset else mode,  # Job's default; JobSet's is Indexed
            "NonIndexed",
            '[rendezvous] store = "control"',
            "the Job controller gives the pod of an Indexed Job the hostname <Job name>-<index>, "
            f"whatever its template says, so {control_name(p)} would not resolve"
            + ("; JobSet makes a replicated job Indexed when this is not set" if jobset else ""),
        )
        template = (*job, "template")
        pod = (*template, "spec")
        spec = _get(doc.data, pod)
        if not isinstance(spec, dict):
            yield self.shape(doc, pod, "has no pod template (a mapping)")
            return
        yield from self.mismatch(
            doc, (*pod, "hostname"), spec.get("hostname", _MISSING), control_job_name(p), "[job] name", dns
        )
        found = spec.get("subdomain", _MISSING)
        if jobset:  # JobSet sets the pods' subdomain itself, as for the training pods
            yield from self.mismatch(doc, (*pod, "subdomain"), found, p.service, "[rendezvous] service", dns)
        elif isinstance(found, str) and self.subdomains and found not in self.subdomains:
            yield self.finding(
                "error",
                "manifest-subdomain",
                doc,
                (*pod, "subdomain"),
                found,
                f"is not the training pods' subdomain ({toml_value(self.subdomains[0])}): they dial "
                f"the control pod as {control_job_name(p)}.<their subdomain>..., a name it does not have",
                "give the control pod the training pods' subdomain (the nameReference configuration "
                'of docs/kubernetes.md, "Kustomize", renames both)',
            )
        else:
            yield from self.subdomain(doc, pod, found, dns)
        if jobset:  # JobSet's own headless Service selects its pods by the JobSet's name
            selected = (
                "the NetworkPolicy covers the job's pods by this label: without it the control "
                "pod's rendezvous store, which has no authentication, is open to every pod"
            )
        else:
            selected = (
                f"the headless Service selects the job's pods by this label: without it {control_name(p)} "
                "does not resolve, and the NetworkPolicy does not cover the control pod"
            )
        labels = _get(doc.data, (*template, "metadata", "labels"))
        for key, value in selector(p).items():
            found = labels.get(key, _MISSING) if isinstance(labels, dict) else _MISSING
            yield from self.mismatch(
                doc,
                (*template, "metadata", "labels", key),
                found,
                value,
                "[job] name" if key == "app.kubernetes.io/instance" else "nvtrain's Service selector",
                selected,
            )
        containers = spec.get("containers")
        containers = containers if isinstance(containers, list) else []
        if not any(_runs_control(c) for c in containers):
            names = [c.get("name") if isinstance(c, dict) else None for c in containers]
            c = names.index(CONTROL_CONTAINER) if CONTROL_CONTAINER in names else 0
            path: YamlPath = (*pod, "containers", c, "command")
            yield self.finding(
                "warning",
                "manifest-mismatch",
                doc,
                path,
                _get(doc.data, path),
                'is not `nvtrain control ...`: with [rendezvous] store = "control" this pod '
                f"runs the rendezvous store that the training pods dial at {control_name(p)}",
                f'set command to ["nvtrain", "control", "/etc/nvtrain/{POLICY_FILE}"], or {self.rerender}',
            )
        yield from self.ports(
            doc, pod, spec, "the rendezvous store in the control pod listens on the policy's port"
        )

    def missing_control(self, docs: Sequence[_Doc]) -> Iterator[Finding]:
        """The control Job that the policy needs and a plain-Job manifest lacks."""
        p = self.policy
        if p is None or not has_control_job(p):
            return
        kinds = [d.data.get("kind") for d in docs]
        if "JobSet" in kinds or "Job" not in kinds or any(self.is_control(d) for d in docs):
            return  # the JobSet, or a file with no Job, has its own finding
        yield self.finding(
            "warning",
            "manifest-mismatch",
            None,
            (),
            _MISSING,
            f'has no control Job {control_job_name(p)}: [rendezvous] store = "control" runs the '
            "rendezvous store in that Job's pod: the training pods wait for "
            f"{control_name(p)} to resolve and exit 3 when [rendezvous] dns_timeout has passed",
            self.rerender,
        )

    def grace(self, doc: _Doc, path: YamlPath) -> Iterator[Finding]:
        value = _get(doc.data, path)
        grace = KUBERNETES_DEFAULT_GRACE if value is _MISSING else value
        if isinstance(grace, bool) or not isinstance(grace, int) or grace < 0:
            yield self.shape(doc, path, "must be a whole number of seconds, 0 or more", value)
            return
        p = self.policy
        if p is not None:
            yield from self.mismatch(
                doc,
                path,
                value,
                grace_period(p),
                f"[job] stop_timeout ({format_duration(p.job.stop_timeout)}) + {GRACE_MARGIN} s",
                "on SIGTERM nvtrain gives the workers stop_timeout and needs the rest to stop "
                "them; Kubernetes kills the pod when the grace period ends",
            )
        write = self.timings.save_write if self.timings is not None else None
        if write is None:
            return
        need = math.ceil(write.worst) + GRACE_MARGIN
        if grace >= need:
            return
        unset = (
            f"(not set: Kubernetes' default is {KUBERNETES_DEFAULT_GRACE} s) " if value is _MISSING else ""
        )
        if p is not None and p.job.stop_timeout >= write.worst:
            fix = f"{self.rerender}; the grace period becomes {grace_period(p)} s"
        else:
            fix = (
                f'raise [job] stop_timeout to at least "{format_duration(write.worst * MARGIN)}", '
                f"then {self.rerender}"
            )
        yield self.finding(
            "warning",
            "grace-before-write",
            doc,
            path,
            value,
            f"{unset}is shorter than the longest measured checkpoint write "
            f"({format_duration(write.worst)}) plus the {GRACE_MARGIN} s nvtrain needs after the "
            "workers stop: Kubernetes kills a pod stopped during a save before the checkpoint "
            "is committed",
            fix,
        )

    def shape(self, doc: _Doc, path: YamlPath, rule: str, value: Any = _MISSING) -> Finding:
        return self.finding(
            "error",
            "manifest-shape",
            doc,
            path,
            value,
            rule,
            f"fix the manifest by hand, or {self.rerender}",
        )


def _documents(text: str, source: str) -> tuple[list[_Doc], Finding | None]:
    loader = yaml.SafeLoader(text)
    docs: list[_Doc] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            data = loader.construct_document(node)
            if data is None:
                continue  # an empty document
            if not isinstance(data, dict):
                line = node.start_mark.line + 1
                return docs, Finding(
                    "error",
                    "manifest-shape",
                    "",
                    None,
                    f"document {len(docs) + 1} is not a Kubernetes object (a mapping with "
                    "apiVersion, kind and metadata)",
                    "give the YAML that `nvtrain manifest` writes",
                    toml_value(data),
                    file=source,
                    line=line,
                    column=node.start_mark.column + 1,
                )
            name = _get(data, ("metadata", "name"))
            label = f"{data.get('kind', '?')} {name if isinstance(name, str) else f'#{len(docs) + 1}'}"
            docs.append(_Doc(data, node, label))
    except (RecursionError, MemoryError) as exc:
        deep = isinstance(exc, RecursionError)
        return docs, Finding(
            "error",
            "too-nested" if deep else "too-large",
            "",
            None,
            "cannot be read: "
            + ("its YAML is nested too deeply" if deep else "it needs more memory than there is"),
            "give the manifest that `nvtrain manifest` writes (Kubernetes objects nest a few levels)",
            file=source,
        )
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return docs, Finding(
            "error",
            "yaml-syntax",
            "",
            None,
            f"is not valid YAML: {problem}",
            "fix the YAML at the position shown, or re-render the file with `nvtrain manifest`",
            file=source,
            line=mark.line + 1 if mark is not None else None,
            column=mark.column + 1 if mark is not None else None,
        )
    finally:
        loader.dispose()
    return docs, None


def _read(path: Path) -> tuple[list[_Doc], Finding | None]:
    """The documents of the manifest at ``path``, or the finding that says why it cannot be read."""
    source = str(path)
    raw, problem = read_source(path, "check the path, or write the file with `nvtrain manifest -o FILE`")
    if raw is None:
        assert problem is not None
        return [], problem
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], Finding(
            "error",
            "not-utf8",
            "",
            None,
            f"is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})",
            "save the file as UTF-8, or re-render it with `nvtrain manifest`",
            file=source,
            line=raw[: exc.start].count(b"\n") + 1,
        )
    return _documents(text, source)


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
    docs, error = _read(path)
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
    probe = _Checker(source, policy, policy_text, policy_source, timings, jobset)
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
    checker = _Checker(
        source, policy, policy_text, policy_source, timings, jobset, services, subdomains, runtime
    )
    findings = [f for doc in docs for f in checker.document(doc)]
    findings += checker.missing_control(docs)
    findings += check_references(checker, docs)
    findings += _namespaces(checker, docs, workloads)
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


def _namespaces(checker: _Checker, docs: Sequence[_Doc], workloads: Sequence[_Doc]) -> Iterator[Finding]:
    """An error on every object whose namespace is not the one of most objects (on a tie, the
    workload's): the pods' DNS names live in their own namespace, and a pod mounts only a
    ConfigMap of its own namespace. Objects with no namespace go where they are applied."""
    written = [(d, ns) for d in docs if isinstance(ns := _get(d.data, ("metadata", "namespace")), str)]
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
    checker = _Checker(source, None, None, "POLICY", None, False)
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

    docs, error = _read(manifest)
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

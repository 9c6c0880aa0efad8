"""The checker of ``nvtrain validate --manifest``: findings at a YAML path of a manifest, and the
comparisons with the policy that the other checks build on.

``ManifestChecker`` holds what one check of a manifest knows (the policy and its text, the
timings, the Services of the file and the training pods' subdomains) and makes findings with
the file, line and YAML path: ``mismatch`` (the manifest differs from what ``nvtrain manifest``
renders), ``renamed`` (it differs in a way the pods survive), the shape errors, the grace period
against the measured checkpoint write, the rendezvous ports, the names the pods are made of, and
which Jobs are the control pod's. ``control_checks`` and ``workload_checks`` add the checks of the
control Job and of the training workload to it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from nvtrain.config.checks import MARGIN
from nvtrain.config.duration import format_duration
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding, Severity, toml_value
from nvtrain.kube.objects import GRACE_MARGIN, control_job_name, grace_period, has_control_job
from nvtrain.kube.yaml_positions import MISSING as _MISSING
from nvtrain.kube.yaml_positions import Doc as _Doc
from nvtrain.kube.yaml_positions import YamlPath, yaml_path
from nvtrain.kube.yaml_positions import get as _get
from nvtrain.kube.yaml_positions import jobset_root as _jobset_root
from nvtrain.kube.yaml_positions import position as _position
from nvtrain.kubenames import CONTROL_SUFFIX, DNS_LABEL_MAX

if TYPE_CHECKING:
    from nvtrain.config.timings import Timings

__all__ = ["KUBERNETES_DEFAULT_GRACE", "ManifestChecker", "runs_control"]

KUBERNETES_DEFAULT_GRACE = 30
"""``terminationGracePeriodSeconds`` when a pod spec leaves it out."""


def runs_control(container: Any) -> bool:
    """Whether ``container`` runs ``nvtrain control ...``."""
    command = container.get("command") if isinstance(container, dict) else None
    return isinstance(command, list) and command[:2] == ["nvtrain", "control"]


class ManifestChecker:
    """What one check of a manifest knows, and how it makes findings and compares with the policy."""

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
        if p.job.name in base and len(last) > DNS_LABEL_MAX:
            yield self.finding(
                "error",
                "manifest-job-name",
                doc,
                path,
                _get(doc.data, path),
                f"{what} {base}-<index>, and the last pod's hostname {last} is longer than "
                f"{DNS_LABEL_MAX} characters, which Kubernetes does not allow: that pod is never "
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

    def is_control(self, doc: _Doc) -> bool:
        """A Job named ``<job>-control``, or, whatever its name, one whose pod runs
        ``nvtrain control``: the store's Job, not the training pods'."""
        p = self.policy
        if p is not None and _get(doc.data, ("metadata", "name")) == control_job_name(p):
            return True
        containers = _get(doc.data, ("spec", "template", "spec", "containers"))
        return isinstance(containers, list) and any(runs_control(c) for c in containers)

    def is_control_replicated(self, doc: _Doc, index: int) -> bool:
        """Replicated job ``index`` of a JobSet is the control pod's: it is named ``control``
        and the policy has the control store (with ``store = "pod0"`` the training pods'
        replicated job may have that name), or, whatever its name, its pod runs ``nvtrain control``."""
        p = self.policy
        at: YamlPath = (*(_jobset_root(doc.data) or ("spec",)), "replicatedJobs", index)
        if p is not None and has_control_job(p) and _get(doc.data, (*at, "name")) == CONTROL_SUFFIX:
            return True
        containers = _get(doc.data, (*at, "template", "spec", "template", "spec", "containers"))
        return isinstance(containers, list) and any(runs_control(c) for c in containers)

"""The checks of the control Job (``[rendezvous] store = "control"``) in a manifest: the plain
Job ``<job>-control``, or the replicated job ``control`` of a JobSet, against the policy.

Its pod runs the rendezvous store that every training pod dials at ``<job>-control.<service>
...``: what gives it that DNS name (hostname, subdomain, ``NonIndexed``), the labels the Service
and the NetworkPolicy select it by, its command and port. Exempt from what applies to the
training pods only (one pod per node, pod names holding ``[job] name``, the grace period against
the checkpoint write).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from nvtrain.findings import Finding, toml_value
from nvtrain.kube.manifest_checker import ManifestChecker, runs_control
from nvtrain.kube.objects import CONTROL_CONTAINER, POLICY_FILE, control_job_name, has_control_job, selector
from nvtrain.kube.yaml_positions import MISSING as _MISSING
from nvtrain.kube.yaml_positions import Doc as _Doc
from nvtrain.kube.yaml_positions import YamlPath
from nvtrain.kube.yaml_positions import get as _get
from nvtrain.kubenames import control_name

__all__ = ["ControlChecks"]


class ControlChecks(ManifestChecker):
    """The checks of the control Job: ``ManifestChecker`` with the control pod's rules."""

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
            if isinstance(found, str) and (self.services or jobset):
                # Relabelled (a Kustomize labels or commonLabels): whether the Service and the
                # NetworkPolicy still select the pod is manifest_refs' check.
                yield from self.renamed(
                    doc, (*template, "metadata", "labels", key), found, value, "[job] name"
                )
                continue
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
        if not any(runs_control(c) for c in containers):
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

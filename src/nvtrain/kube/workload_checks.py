"""The checks of each document of a manifest against the policy: the training workload (a Job,
a JobSet, a Kubeflow Trainer runtime), the Service's rendezvous port and the policy ConfigMap.

``Checker.document`` is the entry for one document: pods per node, replicas, subdomains, ports,
grace periods, the names the pods are made of, and for a Trainer runtime what Trainer takes from
it (``mlPolicy.numNodes``, no framework policy, no fixed subdomain, the trainer's ancestor label
and its container ``node``). The control Job's checks come from ``ControlChecks``.
"""

from __future__ import annotations

from collections.abc import Iterator

from nvtrain.findings import Finding
from nvtrain.kube.control_checks import ControlChecks
from nvtrain.kube.objects import POLICY_FILE, control_job_name, has_control_job
from nvtrain.kube.trainer_runtime import ANCESTOR_LABEL, NODE
from nvtrain.kube.yaml_positions import MISSING as _MISSING
from nvtrain.kube.yaml_positions import TRAINER_RUNTIMES as _TRAINER_RUNTIMES
from nvtrain.kube.yaml_positions import Doc as _Doc
from nvtrain.kube.yaml_positions import YamlPath
from nvtrain.kube.yaml_positions import get as _get
from nvtrain.kube.yaml_positions import jobset_root as _jobset_root
from nvtrain.kubenames import CONTROL_SUFFIX, control_name

__all__ = ["Checker"]


class Checker(ControlChecks):
    """The whole checker of ``nvtrain validate --manifest``: each document against the policy."""

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

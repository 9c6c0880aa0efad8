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
its DNS name and what it runs, and never taken for the workload.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from nvtrain.config.checks import MARGIN
from nvtrain.config.duration import format_duration
from nvtrain.config.load import read_source
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding, Severity, toml_value
from nvtrain.launcher.dns import control_name
from nvtrain.templates.manifest import (
    CONTROL_CONTAINER,
    GRACE_MARGIN,
    POLICY_FILE,
    control_job_name,
    grace_period,
    has_control_job,
    selector,
)

if TYPE_CHECKING:
    from nvtrain.config.timings import Timings
    from nvtrain.config.validation import Validation

__all__ = ["KUBERNETES_DEFAULT_GRACE", "check_manifest", "with_manifest"]

KUBERNETES_DEFAULT_GRACE = 30
"""``terminationGracePeriodSeconds`` when a pod spec leaves it out."""

YamlPath = tuple[str | int, ...]


@dataclasses.dataclass(frozen=True)
class _Doc:
    """One YAML document that is a mapping: its data and its node tree (for line numbers)."""

    data: dict[str, Any]
    node: yaml.Node
    label: str
    """``<kind> <name>``, the finding's table (``Job llm-train``)."""


class _Missing:
    pass


_MISSING = _Missing()


def _runs_control(container: Any) -> bool:
    """Whether ``container`` runs ``nvtrain control ...``."""
    command = container.get("command") if isinstance(container, dict) else None
    return isinstance(command, list) and command[:2] == ["nvtrain", "control"]


def yaml_path(path: YamlPath) -> str:
    """``spec.replicatedJobs[0].template``; keys with a dot are quoted (``data["policy.toml"]``)."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif "." in part or not part:
            text += f'["{part}"]'
        else:
            text += f".{part}" if text else part
    return text


def _get(data: Any, path: YamlPath) -> Any:
    for part in path:
        if isinstance(part, int):
            if not isinstance(data, list) or part >= len(data):
                return _MISSING
        elif not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


def _position(node: yaml.Node, path: YamlPath) -> tuple[int, int]:
    """1-based line and column of ``path`` (of its key), or of the deepest part that exists."""
    mark = node.start_mark
    for part in path:
        if isinstance(part, int) and isinstance(node, yaml.SequenceNode) and part < len(node.value):
            node = node.value[part]
            mark = node.start_mark
            continue
        if isinstance(part, str) and isinstance(node, yaml.MappingNode):
            found = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part]
            if found:
                key, node = found[-1]
                mark = key.start_mark
                continue
        break
    return mark.line + 1, mark.column + 1


class _Checker:
    def __init__(
        self,
        source: str,
        policy: Policy | None,
        policy_text: str | None,
        policy_source: str,
        timings: Timings | None,
        jobset: bool,
    ) -> None:
        self.source = source
        self.policy = policy
        self.policy_text = policy_text
        self.timings = timings
        flag = " --jobset" if jobset else ""
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

    # -- one document ---------------------------------------------------------------------------

    def document(self, doc: _Doc) -> Iterator[Finding]:
        kind = doc.data.get("kind")
        p = self.policy
        namespace = _get(doc.data, ("metadata", "namespace"))
        if p is not None and namespace is not _MISSING:
            yield from self.mismatch(
                doc,
                ("metadata", "namespace"),
                namespace,
                p.rendezvous.namespace,
                "[rendezvous] namespace",
                "the pods look their peers up by DNS names in the policy's namespace",
            )
        if kind == "Job" and self.is_control(doc):
            yield from self.control_job(doc)
        elif kind == "Job":
            yield from self.job_spec(doc, ("spec",))
        elif kind == "JobSet":
            yield from self.jobset(doc)
        elif kind == "Service" and p is not None and _get(doc.data, ("metadata", "name")) == p.service:
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
        p = self.policy
        if p is not None and has_control_job(p):
            yield self.finding(
                "warning",
                "manifest-mismatch",
                doc,
                ("kind",),
                "JobSet",
                '[rendezvous] store = "control" needs the control pod '
                f"{control_job_name(p)} beside the training pods, and a JobSet cannot hold it: "
                "JobSet names its pods itself and its Service selects pods by JobSet name, so "
                f"{control_name(p)} would never resolve",
                "render the plain Job (`nvtrain manifest` without --jobset), or set "
                'store = "pod0" in [rendezvous] and re-render',
            )
        if p is not None:
            yield from self.mismatch(
                doc,
                ("spec", "network", "subdomain"),
                _get(doc.data, ("spec", "network", "subdomain")),
                p.service,
                "[rendezvous] service",
                "the pods dial pod 0 as <name>-0.<service>, and JobSet names the headless Service "
                "after this subdomain",
            )
        replicated = _get(doc.data, ("spec", "replicatedJobs"))
        if not isinstance(replicated, list) or not replicated:
            yield self.shape(doc, ("spec", "replicatedJobs"), "has no replicated Job (a non-empty list)")
            return
        for i in range(len(replicated)):
            if p is not None:
                replicas = _get(doc.data, ("spec", "replicatedJobs", i, "replicas"))
                yield from self.mismatch(
                    doc,
                    ("spec", "replicatedJobs", i, "replicas"),
                    1 if replicas is _MISSING else replicas,  # JobSet's default
                    1,
                    f"[rendezvous] nodes = {p.rendezvous.nodes} (one Job with a pod per node)",
                    f"the pods of further replicas would never join the rendezvous of pod {p.job.name}-0",
                )
            yield from self.job_spec(doc, ("spec", "replicatedJobs", i, "template", "spec"))

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
        yield from self.mismatch(
            doc,
            (*pod, "subdomain"),
            spec.get("subdomain", _MISSING),
            p.service,
            "[rendezvous] service",
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

    def control_job(self, doc: _Doc) -> Iterator[Finding]:
        """The control Job against the policy. It saves no checkpoint, so its grace period is
        not compared with the timings; without a valid policy there is nothing else to compare."""
        p = self.policy
        if p is None:
            return
        r = p.rendezvous
        if not has_control_job(p):
            yield self.finding(
                "warning",
                "manifest-mismatch",
                doc,
                ("metadata", "name"),
                _get(doc.data, ("metadata", "name")),
                "is a control Job, which nvtrain renders only with [rendezvous] store = "
                f'"control" and 2 or more nodes (the policy has store = "{r.store}", nodes = '
                f"{r.nodes}): the training pods never dial its store, and its pod only waits",
                f"delete this Job from the file, or {self.rerender}",
            )
            return
        template = ("spec", "template")
        pod = (*template, "spec")
        spec = _get(doc.data, pod)
        if not isinstance(spec, dict):
            yield self.shape(doc, pod, "has no pod template (a mapping)")
            return
        dns = (
            f"the training pods dial the rendezvous store at {control_name(p)}, a name that the "
            "control pod has only with this hostname and subdomain"
        )
        yield from self.mismatch(
            doc, (*pod, "hostname"), spec.get("hostname", _MISSING), control_job_name(p), "[job] name", dns
        )
        yield from self.mismatch(
            doc, (*pod, "subdomain"), spec.get("subdomain", _MISSING), p.service, "[rendezvous] service", dns
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
                f"the headless Service selects the job's pods by this label: without it {control_name(p)} "
                "does not resolve, and the NetworkPolicy does not cover the control pod",
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
    ``[rendezvous] store = "control"``; with ``policy_text`` also the policy in the ConfigMap).
    With ``timings``: grace periods of the training pods shorter than the measured checkpoint
    write plus ``GRACE_MARGIN``."""
    source = str(path)
    raw, problem = read_source(path, "check the path, or write the file with `nvtrain manifest -o FILE`")
    if raw is None:
        assert problem is not None
        return [problem]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [
            Finding(
                "error",
                "not-utf8",
                "",
                None,
                f"is not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})",
                "save the file as UTF-8, or re-render it with `nvtrain manifest`",
                file=source,
                line=raw[: exc.start].count(b"\n") + 1,
            )
        ]
    docs, error = _documents(text, source)
    if error is not None:
        return [error]
    jobset = any(d.data.get("kind") == "JobSet" for d in docs)
    checker = _Checker(source, policy, policy_text, policy_source, timings, jobset)
    findings = [f for doc in docs for f in checker.document(doc)]
    findings += checker.missing_control(docs)
    workloads = [
        d
        for d in docs
        if d.data.get("kind") == "JobSet" or (d.data.get("kind") == "Job" and not checker.is_control(d))
    ]
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


def _kinds(docs: Sequence[_Doc]) -> str:
    return "objects: " + ", ".join(d.label for d in docs) if docs else "no objects"


def with_manifest(
    result: Validation, manifest: Path, policy: Path | None, timings: Timings | None
) -> Validation:
    """``result`` (the validation of ``policy``) with the findings of ``check_manifest`` after
    its own. Timings problems are already in ``result``; an invalid policy is left out of the
    comparison."""
    from nvtrain.config.demo import demo_policy_text

    usable = result.policy if result.ok else None
    text: str | None = None
    if usable is not None:
        raw = demo_policy_text().encode("utf-8") if policy is None else read_source(policy)[0]
        text = raw.decode("utf-8", errors="replace") if raw is not None else None
    found = check_manifest(
        manifest,
        usable,
        policy_text=text,
        policy_source=str(policy) if policy is not None else "POLICY",
        timings=timings,
    )
    return dataclasses.replace(result, findings=[*result.findings, *found])

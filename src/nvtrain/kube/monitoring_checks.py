"""``nvtrain validate --manifest``: the alerts and the dashboard of ``--monitoring-rules`` after an
edit (Kustomize ``namespace:``, ``namePrefix``, ``nameSuffix``, or by hand).

An edit that moves the objects to another namespace or renames the Job leaves the PromQL inside
the PrometheusRule and the dashboard's JSON as it was. ``nvtrain manifest`` names no namespace in
them (``monitoring_queries``), but a manifest rendered by an older nvtrain, or edited by hand,
may: a query whose ``namespace`` matcher does not match the namespace of the training Job (of
the object itself when the file holds no Job) reads another namespace's series, and its alerts
never fire. So do ``pod``, ``job_name`` and
``owner_name`` matchers that no training Job of the file matches any more (after a
``namePrefix``). A dashboard keeps the uid, title and file name of the namespace it was
rendered for, and two copies of it in two namespaces replace each other in Grafana. Each is a
warning (``manifest-monitoring``) on the object, with the fix: render again with the new
namespace or name in the policy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from nvtrain.findings import Finding, toml_value
from nvtrain.kube.manifest_checker import ManifestChecker
from nvtrain.kube.monitoring_queries import dashboard_uid
from nvtrain.kube.yaml_positions import Doc, YamlPath
from nvtrain.kube.yaml_positions import get as _get
from nvtrain.kube.yaml_positions import jobset_root as _jobset_root
from nvtrain.kubenames import CONTROL_SUFFIX

__all__ = ["CODE", "check_monitoring"]

CODE = "manifest-monitoring"

DASHBOARD_LABEL = "grafana_dashboard"  # alerts.DASHBOARD_LABEL, not imported: alerts imports more

_MATCHER = re.compile(r'\b(namespace|pod|job_name|owner_name)\s*(=~|=)\s*"((?:[^"\\]|\\.)*)"')
"""A positive label matcher of PromQL on a label that names the job's place: (label, op, value)."""

_SAMPLE_POD_END = "-0-bcdfg"
"""What a pod's name adds to its Job's: the index and the random end (pod 0 of the Job)."""


def check_monitoring(checker: ManifestChecker, docs: Sequence[Doc]) -> Iterator[Finding]:
    """Warnings where a query of a PrometheusRule or a Grafana dashboard ConfigMap of ``docs``
    reads another namespace, or names a Job that is not the file's; and where a dashboard's uid
    is not the one of its namespace and job."""
    jobs, job_namespace = _training_jobs(checker, docs)
    for doc in docs:
        # The job's namespace: the PrometheusRule and the dashboard may live elsewhere (where
        # Prometheus and Grafana look), their queries are about the job's pods.
        namespace = job_namespace or _get(doc.data, ("metadata", "namespace"))
        if not isinstance(namespace, str):
            continue  # applied wherever kubectl applies it: nothing to compare with
        if doc.data.get("kind") == "PrometheusRule":
            for path, expr in _rule_expressions(doc):
                yield from _query(checker, doc, path, [expr], namespace, jobs)
        elif (
            doc.data.get("kind") == "ConfigMap"
            and _get(doc.data, ("metadata", "labels", DASHBOARD_LABEL)) == "1"
        ):
            yield from _dashboard(checker, doc, namespace, jobs)


def _training_jobs(checker: ManifestChecker, docs: Sequence[Doc]) -> tuple[list[str], str | None]:
    """The names of the training Jobs of the file (a Job that is not the control Job, each
    replicated Job of a JobSet, ``<jobset>-<replicated job>-0``, but ``control``), and the
    namespace of the first one that names its namespace."""
    found = []
    namespace = None
    for doc in docs:
        name = _get(doc.data, ("metadata", "name"))
        if not isinstance(name, str):
            continue
        if doc.data.get("kind") in ("Job", "JobSet") and not checker.is_control(doc) and namespace is None:
            written = _get(doc.data, ("metadata", "namespace"))
            namespace = written if isinstance(written, str) else None
        if doc.data.get("kind") == "Job" and not checker.is_control(doc):
            found.append(name)
        elif doc.data.get("kind") == "JobSet" and (root := _jobset_root(doc.data)) is not None:
            replicated = _get(doc.data, (*root, "replicatedJobs"))
            for job in replicated if isinstance(replicated, list) else []:
                rjob = job.get("name") if isinstance(job, dict) else None
                if isinstance(rjob, str) and rjob != CONTROL_SUFFIX:
                    found.append(f"{name}-{rjob}-0")
    return found, namespace


def _rule_expressions(doc: Doc) -> Iterator[tuple[YamlPath, str]]:
    groups = _get(doc.data, ("spec", "groups"))
    for i, group in enumerate(groups if isinstance(groups, list) else []):
        rules = group.get("rules") if isinstance(group, dict) else None
        for j, rule in enumerate(rules if isinstance(rules, list) else []):
            expr = rule.get("expr") if isinstance(rule, dict) else None
            if isinstance(expr, str):
                yield ("spec", "groups", i, "rules", j, "expr"), expr


def _matches(pattern: str, op: str, value: str) -> bool:
    if op == "=":
        return pattern == value
    try:
        return re.fullmatch(pattern, value) is not None
    except re.error:
        return True  # not a Python regex: nothing to say about it


def _stale(expr: str, namespace: str, jobs: Sequence[str]) -> tuple[list[str], list[str]]:
    """The matchers of ``expr`` that read another namespace than ``namespace``, and those that
    pick a name that none of ``jobs`` (nor their pods) has; each once."""
    places: list[str] = []
    names: list[str] = []
    for label, op, value in _MATCHER.findall(expr):
        matcher = f'{label}{op}"{value}"'
        if label == "namespace":
            if not _matches(value, op, namespace) and matcher not in places:
                places.append(matcher)
            continue
        wanted = [f"{job}{_SAMPLE_POD_END}" for job in jobs] if label == "pod" else list(jobs)
        if wanted and not any(_matches(value, op, n) for n in wanted) and matcher not in names:
            names.append(matcher)
    return places, names


def _query(
    checker: ManifestChecker,
    doc: Doc,
    path: YamlPath,
    exprs: Sequence[str],
    namespace: str,
    jobs: Sequence[str],
) -> Iterator[Finding]:
    """At most two warnings on ``path`` (a rule's expression, or a dashboard's every query):
    matchers of another namespace, and matchers of names no training Job of the file has."""
    places: list[str] = []
    names: list[str] = []
    for expr in exprs:
        bad_places, bad_names = _stale(expr, namespace, jobs)
        places += [m for m in bad_places if m not in places]
        names += [m for m in bad_names if m not in names]
    shown = exprs[0] if len(exprs) == 1 else f"{len(exprs)} queries"
    if places:
        yield checker.finding(
            "warning",
            CODE,
            doc,
            path,
            shown,
            f"reads the namespace {', '.join(places)}, and the job is in {toml_value(namespace)} "
            "(after a Kustomize `namespace:` or an edit): it reads no series of this job, and its "
            "alerts or panels stay empty",
            f"render it again with [rendezvous] namespace = {toml_value(namespace)}, or remove the "
            f"namespace matcher (nvtrain renders none); {checker.rerender}",
        )
    if names:
        yield checker.finding(
            "warning",
            CODE,
            doc,
            path,
            shown,
            f"picks {', '.join(names)}, which matches no training Job of the file "
            f"({', '.join(jobs)}), as after a Kustomize namePrefix or nameSuffix: it reads no "
            "series of this job",
            f"render it again with [job] name = {toml_value(jobs[0])}; {checker.rerender}",
        )


def _panel_expressions(board: dict[str, Any]) -> Iterator[str]:
    panels = board.get("panels")
    for panel in panels if isinstance(panels, list) else []:
        targets = panel.get("targets") if isinstance(panel, dict) else None
        for target in targets if isinstance(targets, list) else []:
            expr = target.get("expr") if isinstance(target, dict) else None
            if isinstance(expr, str):
                yield expr


def _dashboard(checker: ManifestChecker, doc: Doc, namespace: str, jobs: Sequence[str]) -> Iterator[Finding]:
    data = doc.data.get("data")
    for key, text in data.items() if isinstance(data, dict) else []:
        try:
            board: Any = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            continue
        if not isinstance(board, dict):
            continue
        path: YamlPath = ("data", key)
        yield from _query(checker, doc, path, list(_panel_expressions(board)), namespace, jobs)
        if checker.policy is None:
            continue
        want = dashboard_uid(namespace, checker.policy.job.name)
        uid = board.get("uid")
        if isinstance(uid, str) and uid.startswith("nvtrain-") and uid != want:
            yield checker.finding(
                "warning",
                CODE,
                doc,
                path,
                uid,
                f"the dashboard's uid {toml_value(uid)} is not the one of [job] name "
                f"{toml_value(checker.policy.job.name)} in the namespace {toml_value(namespace)} "
                f"({toml_value(want)}): it was rendered for another namespace, and copies of it in "
                "two namespaces replace each other in Grafana",
                f"render it again with [rendezvous] namespace = {toml_value(namespace)}; {checker.rerender}",
            )

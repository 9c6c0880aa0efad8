"""How the queries of ``--monitoring-rules`` pick this job's series, and the dashboard's identity.

A Kustomize ``namespace:`` rewrites every object's ``metadata.namespace`` and nothing inside a
PrometheusRule's expressions or a dashboard's JSON, so the queries name **no namespace**: they
keep the ``namespace`` label of the series they read (Kubernetes service discovery and
kube-state-metrics put it there), and every alert carries the namespace where it fires. The job
is picked by its names, matched whole (Prometheus anchors ``=~`` at both ends):

- the pods' series (``nvtrain_*``, and kube-state-metrics' ``kube_pod_*``) by ``pod``: an
  Indexed Job's pods are ``<job>-<index>-<5 random characters>``, and a JobSet's (``[job] name``
  is ``<jobset>-<replicated job>-0``) are too;
- kube-state-metrics' ``kube_job_*`` by ``job_name``: the Job ``[job] name``.

A Kubeflow Trainer runtime serves every TrainJob that names it: the Job of TrainJob ``<t>`` is
``<t>-node-0``; the pattern is that of the ``<t>`` that hold ``[job] name`` (a TrainJob of another
name, such as the Kubeflow SDK's random ones, is not picked: nothing in kube-state-metrics'
default labels tells which runtime a TrainJob names).

A ``namePrefix`` or ``nameSuffix`` renames the Job and its pods and leaves the expressions as
they are, and a dashboard's uid, title and file name keep the namespace they were rendered for:
``monitoring_checks`` tells ``nvtrain validate --manifest`` to warn about both.
"""

from __future__ import annotations

import hashlib

from nvtrain.config.schema import Policy

__all__ = [
    "POD_SUFFIX",
    "dashboard_file",
    "dashboard_title",
    "dashboard_uid",
    "job_pattern",
    "pod_pattern",
    "series_selector",
]

POD_SUFFIX = "[a-z0-9]{5}"
"""The random end of a pod's name (``generateName``), in a regex."""

_NAME = "[a-z0-9-]*"


def job_pattern(policy: Policy, *, runtime: bool = False) -> str:
    """A regex of the name of the job's Kubernetes Job: ``[job] name`` itself (a DNS label:
    nothing in it is special in a regex), or for a Trainer runtime every ``<t>-node-0`` whose
    ``<t>`` holds it."""
    name = policy.job.name
    return f"{_NAME}{name}{_NAME}-node-0" if runtime else name


def pod_pattern(job: str, index: str = "[0-9]+") -> str:
    """A regex of the names of the pods of the Job ``job`` (a regex), of ``index`` (a regex)."""
    return f"{job}-{index}-{POD_SUFFIX}"


def series_selector(policy: Policy, *, runtime: bool = False) -> str:
    """The label matcher of this job's pods' series: their pod names, in any namespace."""
    return f'pod=~"{pod_pattern(job_pattern(policy, runtime=runtime))}"'


def dashboard_uid(namespace: str, job: str) -> str:
    """The Grafana uid of the dashboard of ``job`` in ``namespace``: unique per both (a uid is
    global to a Grafana, and at most 40 characters)."""
    digest = hashlib.sha256(f"{namespace}/{job}".encode()).hexdigest()[:16]
    return f"nvtrain-{job}"[:23] + f"-{digest}"


def dashboard_title(namespace: str, job: str) -> str:
    """The dashboard's title: Grafana refuses two of one title in one folder."""
    return f"nvtrain: {namespace}/{job}"


def dashboard_file(namespace: str, job: str) -> str:
    """The ConfigMap key of the dashboard: Grafana's sidecar writes every dashboard ConfigMap's
    keys into one folder, so the key must differ between namespaces."""
    return f"nvtrain-{namespace}-{job}.json"

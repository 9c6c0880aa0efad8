"""``--monitoring-rules``: Prometheus alerts and a Grafana dashboard for one job's metrics.

With ``[metrics] enabled = true`` every training pod serves the job's figures (docs/report.md,
"Metrics contract"; ``nvtrain.live``). ``--monitoring-rules`` adds two objects that read
them:

- a Prometheus Operator ``PrometheusRule`` ``<job>-alerts`` (``monitoring.coreos.com/v1``), whose
  ``spec`` is also a plain Prometheus rules file (``groups:``) for a Prometheus without the
  Operator;
- a ConfigMap ``<job>-dashboard`` holding a Grafana dashboard (JSON), labelled
  ``grafana_dashboard: "1"``, the label by which the Grafana of kube-prometheus-stack loads
  dashboards from ConfigMaps.

The job's figures are served once per run, by the pod of node rank 0, and every pod serves its
own ``nvtrain_pod_*`` figures (labelled ``node_rank``). Each job-level expression still takes
``max`` over a run (``by (namespace, run_id)``) before comparing, so that the old and the new pod
0 (replaced, with the same index) count once while both are still in Prometheus' lookback. Points
in time are unix timestamps (``*_timestamp_seconds``): ``time() - x`` is the age, and stays
right while the series is stale. The series are the job's pods', picked by their whole names in
any namespace (``monitoring_queries``: what survives a Kustomize ``namespace:``). What the pods
cannot report themselves (pod 0 gone, pods replaced over and over, the Job failed) comes from
kube-state-metrics (``kube_pod_*``, ``kube_job_*``, with its default labels). Thresholds come
from the policy where it has them: a recovery is late after ``[rendezvous] dns_timeout +
join_timeout``, a checkpoint stale after two ``[checkpoint] interval``; pods fail too often
past ``RESTARTS_PER_HOUR`` failed pods in an hour.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from nvtrain.config.duration import format_duration
from nvtrain.config.schema import Policy
from nvtrain.kube.monitoring_queries import (
    dashboard_file,
    dashboard_title,
    dashboard_uid,
    job_pattern,
    pod_pattern,
    series_selector,
)

__all__ = [
    "DASHBOARD_LABEL",
    "POD_ZERO_MISSING",
    "STALL_SECONDS",
    "alert_rules",
    "dashboard",
    "dashboard_configmap",
    "prometheus_rule",
    "series_selector",
]

DASHBOARD_LABEL = "grafana_dashboard"
"""The ConfigMap label that Grafana's dashboard sidecar (kube-prometheus-stack) watches for."""

STALL_SECONDS = 900
"""No step for this long, with no recovery going on: the job hangs in a way that neither the
heartbeats nor the collective timeout caught (or a step takes longer than that)."""

_Rule = Callable[[str, str, str, str, str, str], dict[str, Any]]
"""``rule(alert, expr, for, severity, summary, description)``: one alerting rule of the job."""

RESTARTS_PER_HOUR = 3
"""More restarts than this in one hour: the job spends its time recovering."""

POD_ZERO_MISSING = "10m"
"""No running pod 0 for this long while the Job has pods: pod 0 was evicted and its replacement
is Pending (no capacity, an image that does not pull), and the job serves no figures meanwhile."""


def _run(expr: str) -> str:
    """``expr`` (a metric with its matchers) taken once per run: pod 0 serves the job's figures,
    and a replaced pod 0 and its predecessor may both be in Prometheus for a while."""
    return f"max by (namespace, run_id) ({expr})"


def alert_rules(policy: Policy, *, runtime: bool = False) -> list[dict[str, Any]]:
    """The alerting rules of the job (one rule group's ``rules``); ``runtime``: of every
    TrainJob of a Trainer runtime (``monitoring_queries.job_pattern``)."""
    s = series_selector(policy, runtime=runtime)
    job = policy.job.name
    late = math.ceil(policy.rendezvous.dns_timeout + policy.rendezvous.join_timeout)
    interval = policy.checkpoint.interval

    def rule(name: str, expr: str, for_: str, severity: str, summary: str, text: str) -> dict[str, Any]:
        return {
            "alert": name,
            "expr": expr,
            "for": for_,
            "labels": {"severity": severity, "nvtrain_job": job},
            "annotations": {"summary": summary, "description": text},
        }

    return [
        rule(
            "NvtrainStepStalled",
            f"time() - {_run(f'nvtrain_last_step_timestamp_seconds{{{s}}}')} > {STALL_SECONDS} "
            f"and on (namespace, run_id) {_run(f'nvtrain_recovering{{{s}}}')} == 0",
            "5m",
            "critical",
            f"{job}: no training step for {format_duration(STALL_SECONDS)}",
            "Run {{ $labels.run_id }} logged no step for {{ $value | humanizeDuration }} and is not "
            "recovering: a hang that no timeout caught, or a step slower than the alert allows. "
            "Look at the pods' logs and `nvtrain report`.",
        ),
        rule(
            "NvtrainRecoveryTooLong",
            f"{_run(f'nvtrain_recovering{{{s}}}')} == 1",
            f"{late}s",
            "warning",
            f"{job}: a recovery is taking more than {format_duration(late)}",
            "Run {{ $labels.run_id }} has been recovering for longer than [rendezvous] dns_timeout + "
            "join_timeout: pods may be Pending (no capacity) or failing to join.",
        ),
        rule(
            "NvtrainRestartsFrequent",
            f"{_run(f'sum by (namespace, run_id, pod) (increase(nvtrain_restarts_total{{{s}}}[1h]))')}"
            f" > {RESTARTS_PER_HOUR}",
            "0m",
            "warning",
            f"{job}: more than {RESTARTS_PER_HOUR} restarts in an hour",
            "Run {{ $labels.run_id }} restarted {{ $value }} times in the last hour; "
            "nvtrain_restarts_total by layer and cause says which.",
        ),
        rule(
            "NvtrainCheckpointStale",
            f"{_run(f'nvtrain_checkpoint_age_steps{{{s}}}')} > {2 * interval}",
            "10m",
            "warning",
            f"{job}: no checkpoint committed for {2 * interval} steps",
            f"Run {{{{ $labels.run_id }}}} is more than twice [checkpoint] interval ({interval} steps) "
            "past its newest committed checkpoint: a fault now loses that much.",
        ),
        rule(
            "NvtrainCheckpointProblems",
            "max by (namespace, run_id, problem) "
            f"(increase(nvtrain_checkpoint_problems_total{{{s}}}[30m])) > 0",
            "0m",
            "warning",
            f"{job}: checkpoint problems",
            "Run {{ $labels.run_id }}: {{ $labels.problem }} checkpoint saves or folders in the "
            "last 30 minutes.",
        ),
        rule(
            "NvtrainRunFailed",
            f"{_run(f'nvtrain_exit_code{{{s}}}')} > 0",
            "0m",
            "critical",
            f"{job}: the run exited with a failure",
            "Run {{ $labels.run_id }} exited with code {{ $value }} (docs/kubernetes.md, "
            '"Exit codes and retries").',
        ),
    ] + _cluster_rules(policy, runtime, rule)


def _cluster_rules(policy: Policy, runtime: bool, rule: _Rule) -> list[dict[str, Any]]:
    """The rules on kube-state-metrics' series: what the pods cannot report themselves."""
    job = policy.job.name
    name = job_pattern(policy, runtime=runtime)
    jobs = f'job_name=~"{name}"'
    # A pod's Job from its name, where a series has only the pod's (the index, the random end).
    pod0 = f'kube_pod_status_phase{{phase="Running", pod=~"{pod_pattern(name, "0")}"}}'
    running0 = f'label_replace({pod0}, "job_name", "$1", "pod", "{pod_pattern("(.+)", "0")}")'
    # The job's pods that failed in the last hour (and were replaced, or the Job failed): seen
    # Failed in the hour, and created in it (a pod that failed long ago stays Failed in the API).
    pods = f'pod=~"{pod_pattern(name)}"'
    failed = f'kube_pod_status_phase{{phase="Failed", {pods}}}'
    failed = f"max by (namespace, pod) (max_over_time({failed}[1h])) == 1"
    young = f"max by (namespace, pod) (max_over_time(kube_pod_created{{{pods}}}[1h])) > time() - 3600"
    failing = f"{failed} and on (namespace, pod) {young}"
    failing = f'label_replace({failing}, "job_name", "$1", "pod", "{pod_pattern("(.+)")}")'
    return [
        rule(
            "NvtrainPodZeroMissing",
            f"max by (namespace, job_name) (kube_job_status_active{{{jobs}}}) > 0 "
            f"unless on (namespace, job_name) max by (namespace, job_name) ({running0} == 1)",
            POD_ZERO_MISSING,
            "critical",
            f"{job}: pod 0 is not running",
            "Job {{ $labels.job_name }} in {{ $labels.namespace }} has pods but no running pod 0 "
            "(evicted, Pending, or failing to start): the job neither trains nor serves its "
            "figures. `kubectl describe pod` on its pod 0 says why.",
        ),
        rule(
            "NvtrainPodsReplacedFrequent",
            f"count by (namespace, job_name) ({failing}) > {RESTARTS_PER_HOUR}",
            "0m",
            "warning",
            f"{job}: more than {RESTARTS_PER_HOUR} pods failed in an hour",
            "Job {{ $labels.job_name }} in {{ $labels.namespace }} had {{ $value }} pods fail in the "
            "last hour: pods are failing and replaced over and over (a crash loop that a new pod "
            "does not fix, or evictions). `kubectl logs` and `kubectl describe pod` on the failed "
            "pods say why.",
        ),
        rule(
            "NvtrainJobFailed",
            f'max by (namespace, job_name) (kube_job_failed{{{jobs}, condition="true"}}) == 1',
            "0m",
            "critical",
            f"{job}: the Job failed",
            "Job {{ $labels.job_name }} in {{ $labels.namespace }} failed (its backoff limit, or a "
            'pod failure policy rule that fails the Job): docs/kubernetes.md, "Exit codes and '
            'retries".',
        ),
    ]


def prometheus_rule(policy: Policy, metadata: Mapping[str, Any], *, runtime: bool = False) -> dict[str, Any]:
    """The PrometheusRule of the job's alerts; its ``spec`` is a Prometheus rules file."""
    rules = alert_rules(policy, runtime=runtime)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": dict(metadata),
        "spec": {"groups": [{"name": f"nvtrain-{policy.job.name}", "rules": rules}]},
    }


_PANELS: tuple[tuple[str, str, str], ...] = (
    # (title, unit, expression with {s} for the series matchers)
    ("Step", "none", "max by (namespace, run_id) (nvtrain_step{{{s}}})"),
    ("Training goodput", "percentunit", "max by (namespace, run_id) (nvtrain_training_goodput_ratio{{{s}}})"),
    (
        "Infrastructure goodput",
        "percentunit",
        "max by (namespace, run_id) (nvtrain_infrastructure_goodput_ratio{{{s}}})",
    ),
    (
        "Seconds since the last step",
        "s",
        "time() - max by (namespace, run_id) (nvtrain_last_step_timestamp_seconds{{{s}}})",
    ),
    ("Recovering", "none", "max by (namespace, run_id) (nvtrain_recovering{{{s}}})"),
    (
        "Restarts per hour, by layer",
        "none",
        "max by (namespace, run_id, layer) "
        "(sum by (namespace, run_id, layer, pod) (increase(nvtrain_restarts_total{{{s}}}[1h])))",
    ),
    (
        "Recovery time p95, by layer",
        "s",
        "histogram_quantile(0.95, sum by (namespace, le, layer) (max by (namespace, le, layer, run_id) "
        "(rate(nvtrain_recovery_seconds_bucket{{{s}}}[6h]))))",
    ),
    (
        "Steps since the newest checkpoint",
        "none",
        "max by (namespace, run_id) (nvtrain_checkpoint_age_steps{{{s}}})",
    ),
    (
        "Checkpoint blocked time p95",
        "s",
        "histogram_quantile(0.95, sum by (namespace, le) (max by (namespace, le, run_id) "
        "(rate(nvtrain_checkpoint_blocked_seconds_bucket{{{s}}}[1h]))))",
    ),
    ("Steps lost to rollbacks", "none", "max by (namespace, run_id) (nvtrain_lost_steps_total{{{s}}})"),
    # The pods' own figures: one series per pod.
    ("Step of each pod", "none", "max by (namespace, run_id, node_rank) (nvtrain_pod_step{{{s}}})"),
    (
        "Pod replacements, by node",
        "none",
        "max by (namespace, run_id, node_rank) (nvtrain_pod_launcher_starts_total{{{s}}}) - 1",
    ),
)


def dashboard(policy: Policy, *, runtime: bool = False) -> dict[str, Any]:
    """A Grafana dashboard (JSON model) of the job's figures, on the default Prometheus data
    source; its uid and title are the job's in ``[rendezvous] namespace``, its queries read the
    job's pods in every namespace (each series shows its namespace)."""
    s = series_selector(policy, runtime=runtime)
    namespace, job = policy.rendezvous.namespace, policy.job.name
    panels = []
    for i, (title, unit, expr) in enumerate(_PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {"refId": "A", "expr": expr.format(s=s), "legendFormat": "{{namespace}} {{run_id}}"}
                ],
            }
        )
    return {
        "title": dashboard_title(namespace, job),
        "uid": dashboard_uid(namespace, job),
        "tags": ["nvtrain"],
        "timezone": "utc",
        "schemaVersion": 39,
        "time": {"from": "now-24h", "to": "now"},
        "refresh": "1m",
        "panels": panels,
    }


def dashboard_configmap(
    policy: Policy, metadata: Mapping[str, Any], *, runtime: bool = False
) -> dict[str, Any]:
    """The dashboard in a ConfigMap that Grafana's sidecar loads (label ``grafana_dashboard``)."""
    meta = dict(metadata)
    meta["labels"] = {**meta.get("labels", {}), DASHBOARD_LABEL: "1"}
    text = json.dumps(dashboard(policy, runtime=runtime), indent=2, sort_keys=False) + "\n"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {dashboard_file(policy.rendezvous.namespace, policy.job.name): text},
    }

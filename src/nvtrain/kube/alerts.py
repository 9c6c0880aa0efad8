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
0 (replaced, with the same name) count once while both are still in Prometheus' lookback. Points
in time are unix timestamps (``*_timestamp_seconds``): ``time() - x`` is the age, and stays
right while the series is stale. The series are the job's: in the job's
namespace, from pods whose name holds ``[job] name`` (the Job's, the JobSet's and a TrainJob's
pods all do, and so do renamed ones). Thresholds come from the policy where it has them: a
recovery is late after ``[rendezvous] dns_timeout + join_timeout``, a checkpoint stale after two
``[checkpoint] interval``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from nvtrain.config.duration import format_duration
from nvtrain.config.schema import Policy

__all__ = [
    "DASHBOARD_LABEL",
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

RESTARTS_PER_HOUR = 3
"""More restarts than this in one hour: the job spends its time recovering."""


def series_selector(policy: Policy) -> str:
    """The label matchers of this job's series: its namespace, and pods whose name holds the
    job name."""
    # [job] name is a DNS label (letters, digits, '-'): nothing in it is special in a regex.
    return f'namespace="{policy.rendezvous.namespace}", pod=~".*{policy.job.name}.*"'


def _run(expr: str) -> str:
    """``expr`` (a metric with its matchers) taken once per run: pod 0 serves the job's figures,
    and a replaced pod 0 and its predecessor may both be in Prometheus for a while."""
    return f"max by (namespace, run_id) ({expr})"


def alert_rules(policy: Policy) -> list[dict[str, Any]]:
    """The alerting rules of the job (one rule group's ``rules``)."""
    s = series_selector(policy)
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
    ]


def prometheus_rule(policy: Policy, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The PrometheusRule of the job's alerts; its ``spec`` is a Prometheus rules file."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": dict(metadata),
        "spec": {"groups": [{"name": f"nvtrain-{policy.job.name}", "rules": alert_rules(policy)}]},
    }


_PANELS: tuple[tuple[str, str, str], ...] = (
    # (title, unit, expression with {s} for the series matchers)
    ("Step", "none", "max by (run_id) (nvtrain_step{{{s}}})"),
    ("Training goodput", "percentunit", "max by (run_id) (nvtrain_training_goodput_ratio{{{s}}})"),
    (
        "Infrastructure goodput",
        "percentunit",
        "max by (run_id) (nvtrain_infrastructure_goodput_ratio{{{s}}})",
    ),
    (
        "Seconds since the last step",
        "s",
        "time() - max by (run_id) (nvtrain_last_step_timestamp_seconds{{{s}}})",
    ),
    ("Recovering", "none", "max by (run_id) (nvtrain_recovering{{{s}}})"),
    (
        "Restarts per hour, by layer",
        "none",
        "max by (run_id, layer) (sum by (run_id, layer, pod) (increase(nvtrain_restarts_total{{{s}}}[1h])))",
    ),
    (
        "Recovery time p95, by layer",
        "s",
        "histogram_quantile(0.95, sum by (le, layer) (max by (le, layer, run_id) "
        "(rate(nvtrain_recovery_seconds_bucket{{{s}}}[6h]))))",
    ),
    ("Steps since the newest checkpoint", "none", "max by (run_id) (nvtrain_checkpoint_age_steps{{{s}}})"),
    (
        "Checkpoint blocked time p95",
        "s",
        "histogram_quantile(0.95, sum by (le) (max by (le, run_id) "
        "(rate(nvtrain_checkpoint_blocked_seconds_bucket{{{s}}}[1h]))))",
    ),
    ("Steps lost to rollbacks", "none", "max by (run_id) (nvtrain_lost_steps_total{{{s}}})"),
    # The pods' own figures: one series per pod.
    ("Step of each pod", "none", "max by (run_id, node_rank) (nvtrain_pod_step{{{s}}})"),
    (
        "Pod replacements, by node",
        "none",
        "max by (run_id, node_rank) (nvtrain_pod_launcher_starts_total{{{s}}}) - 1",
    ),
)


def dashboard(policy: Policy) -> dict[str, Any]:
    """A Grafana dashboard (JSON model) of the job's figures, on the default Prometheus data source."""
    s = series_selector(policy)
    panels = []
    for i, (title, unit, expr) in enumerate(_PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [{"refId": "A", "expr": expr.format(s=s), "legendFormat": "{{run_id}}"}],
            }
        )
    return {
        "title": f"nvtrain: {policy.job.name}",
        "uid": f"nvtrain-{policy.job.name}"[:40],
        "tags": ["nvtrain"],
        "timezone": "utc",
        "schemaVersion": 39,
        "time": {"from": "now-24h", "to": "now"},
        "refresh": "1m",
        "panels": panels,
    }


def dashboard_configmap(policy: Policy, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The dashboard in a ConfigMap that Grafana's sidecar loads (label ``grafana_dashboard``)."""
    meta = dict(metadata)
    meta["labels"] = {**meta.get("labels", {}), DASHBOARD_LABEL: "1"}
    text = json.dumps(dashboard(policy), indent=2, sort_keys=False) + "\n"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {f"nvtrain-{policy.job.name}.json": text},
    }

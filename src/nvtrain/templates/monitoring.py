"""``--pod-monitor``: a Prometheus Operator ``PodMonitor`` for the training pods' metrics.

With ``[metrics] enabled = true`` every training pod serves its figures at
``http://<pod>:<[metrics] port>/metrics``, from a container port named ``metrics``. Clusters
that run the Prometheus Operator (kube-prometheus-stack) find scrape targets through
``PodMonitor`` objects rather than the ``prometheus.io/*`` annotations, so ``--pod-monitor``
renders one that selects the job's pods and scrapes that port by name. The control pod carries
the same selector labels but no ``metrics`` port, so it is not scraped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvtrain.errors import UsageError

__all__ = ["METRICS_PATH", "METRICS_PORT_NAME", "check_monitoring_rules", "check_pod_monitor", "pod_monitor"]

METRICS_PORT_NAME = "metrics"
"""Name of the training container's metrics port, which the PodMonitor scrapes."""

METRICS_PATH = "/metrics"


def check_pod_monitor(wanted: bool, metrics_enabled: bool) -> None:
    """``--pod-monitor`` needs a metrics endpoint to scrape."""
    if wanted and not metrics_enabled:
        raise UsageError(
            "--pod-monitor needs the policy's metrics endpoint, and [metrics] enabled is false: "
            "the PodMonitor would find nothing to scrape",
            "set enabled = true in [metrics] of the policy, or leave out --pod-monitor",
        )


def check_monitoring_rules(wanted: bool, metrics_enabled: bool) -> None:
    """``--monitoring-rules`` needs the metrics the alerts and the dashboard read."""
    if wanted and not metrics_enabled:
        raise UsageError(
            "--monitoring-rules needs the policy's metrics endpoint, and [metrics] enabled is false: "
            "the alerts and the dashboard would read no series",
            "set enabled = true in [metrics] of the policy, or leave out --monitoring-rules",
        )


def pod_monitor(*, metadata: dict[str, Any], selector: Mapping[str, str]) -> dict[str, Any]:
    """The PodMonitor (``monitoring.coreos.com/v1``) of the pods that ``selector`` picks, in the
    namespace of ``metadata`` (a PodMonitor looks in its own namespace by default)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "podMetricsEndpoints": [{"port": METRICS_PORT_NAME, "path": METRICS_PATH}],
        },
    }

"""``--pod-monitor``: a Prometheus Operator ``PodMonitor`` for the training pods' metrics.

With ``[metrics] enabled = true`` every training pod serves its figures at
``http://<pod>:<[metrics] port>/metrics``, from a container port named ``metrics``. Clusters
that run the Prometheus Operator (kube-prometheus-stack) find scrape targets through
``PodMonitor`` objects rather than the ``prometheus.io/*`` annotations, so ``--pod-monitor``
renders one that selects the job's pods and scrapes that port by name. The control pod carries
the same selector labels but no ``metrics`` port, so it is not scraped.

The job's NetworkPolicy admits the metrics port from every source unless ``--metrics-from
NAMESPACE`` names the namespace of the Prometheus that scrapes it (``metrics_ingress``): nvtrain
cannot know where Prometheus runs, and a port that nothing may reach scrapes nothing. The
endpoint serves figures only, and accepts no input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvtrain.errors import UsageError
from nvtrain.kubenames import is_dns_label

__all__ = [
    "METRICS_PATH",
    "METRICS_PORT_NAME",
    "NAMESPACE_LABEL",
    "check_metrics_from",
    "check_monitoring_rules",
    "check_pod_monitor",
    "metrics_ingress",
    "pod_monitor",
]

METRICS_PORT_NAME = "metrics"
"""Name of the training container's metrics port, which the PodMonitor scrapes."""

METRICS_PATH = "/metrics"

NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""The label Kubernetes puts on every namespace, its name (a namespaceSelector's key)."""


def check_metrics_from(namespace: str | None, metrics_enabled: bool) -> None:
    """``--metrics-from NAMESPACE``: a namespace name, and a metrics port to admit from it."""
    if namespace is None:
        return
    if not metrics_enabled:
        raise UsageError(
            f"--metrics-from {namespace} with [metrics] enabled = false: there is no metrics port "
            "to admit Prometheus to",
            "set enabled = true in [metrics] of the policy, or leave out --metrics-from",
        )
    if not is_dns_label(namespace):
        raise UsageError(
            f"--metrics-from {namespace!r} is not a namespace name",
            "give the namespace where Prometheus runs, e.g. --metrics-from monitoring",
        )


def metrics_ingress(port: int, namespace: str | None) -> dict[str, Any]:
    """The NetworkPolicy ingress rule of the metrics port: from pods of ``namespace`` only, or
    from every source when None."""
    rule: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": port}]}
    if namespace is not None:
        rule = {"from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: namespace}}}], **rule}
    return rule


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

"""The metrics endpoint of ``nvtrain run``: the live figures over HTTP, kept fresh by a thread.

``serve`` exposes them with ``prometheus_client`` (imported only there), behind a server that no
client can hold (``guarded``: a deadline for each request, a bound on connections), and
rebuilds them in a thread of its own every ``refresh`` seconds when the log grew, so a scrape
never waits for a rebuild. An update that fails is counted and logged (``errors``), and serving
goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvtrain.live.errors import ERRORS_HELP, ERRORS_METRIC, UpdateErrors
from nvtrain.live.figures import Family, Sample
from nvtrain.live.follow import LiveFigures
from nvtrain.live.pod import JOB_VIEW_RANK, PodFigures
from nvtrain.runlog import pod_events_file

if TYPE_CHECKING:
    from nvtrain.config.schema import Metrics

__all__ = ["MetricsServer", "bind_address", "own_log", "serve"]


class MetricsServer:
    """A running metrics endpoint and the thread that keeps its figures fresh; ``close`` stops both."""

    def __init__(
        self,
        server: Any,
        threads: list[threading.Thread],
        stop: threading.Event,
        port: int,
        live: LiveFigures | None,
        pod: PodFigures | None = None,
        errors: UpdateErrors | None = None,
    ) -> None:
        self._server = server
        self._threads = threads
        self._stop = stop
        self._live = live
        self._pod = pod
        self._errors = errors or UpdateErrors()
        self.port = port

    @property
    def job_view(self) -> bool:
        """Whether this endpoint serves the job's figures (the pod of ``JOB_VIEW_RANK``)."""
        return self._live is not None

    @property
    def errors(self) -> int:
        """Updates of the figures that failed so far (``nvtrain_metrics_errors_total``)."""
        return self._errors.count

    def catch_up(self) -> None:
        """Read the log to its end and rebuild the figures now, not at the next refresh: the
        run's last events (its exit code) are served at once. Never raises: a failure is
        counted and logged (``errors.UpdateErrors``), and the figures stay as they were."""
        if self._live is not None:
            self._errors.update(self._live, "job")
        if self._pod is not None:
            self._errors.update(self._pod, "pod")

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)


def bind_address(pod_ip: str | None) -> str:
    """Every address of the pod's family: ``::`` on an IPv6 pod (Linux then takes IPv4 too),
    ``0.0.0.0`` otherwise."""
    return "::" if pod_ip and ":" in pod_ip else "0.0.0.0"


def own_log(events: Path, node_rank: int) -> Path:
    """The events log of the pod of ``node_rank``: its file in the run directory ``events``, or
    ``events`` itself when that is one log file."""
    return events if events.suffix == ".jsonl" else pod_events_file(events, node_rank)


def serve(config: Metrics, events: Path, *, run_id: str, node_rank: int, address: str = "") -> MetricsServer:
    """Serve the live figures of ``events`` (the run directory: every pod's log; or one log
    file) on ``config.port`` (every IPv4 address by default): the job's figures on the pod of
    node rank ``JOB_VIEW_RANK`` only, and on every pod ``nvtrain_run_info`` and its own
    pod-level figures (``nvtrain.live.pod``), and ``nvtrain_metrics_errors_total``: the updates
    that failed (``nvtrain.live.errors``: each distinct error is logged once).

    ``OSError`` when the port cannot be bound; the caller names the policy key.
    """
    from prometheus_client import CollectorRegistry, make_wsgi_app
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
    from prometheus_client.registry import Collector

    from nvtrain.live.guarded import start_server

    live = LiveFigures(events, config.refresh) if node_rank == JOB_VIEW_RANK else None
    pod = PodFigures(own_log(events, node_rank))
    stop = threading.Event()
    errors = UpdateErrors()

    def keep_fresh() -> None:
        while True:
            # A log that cannot be read for a moment (shared storage) must not end the updates:
            # the failure is counted and logged, and the figures stay as they were.
            if live is not None:
                errors.update(live, "job")
            errors.update(pod, "pod")
            if stop.wait(live.pause() if live is not None else config.refresh):
                return

    info = {"run_id": run_id, "node_rank": str(node_rank)}

    class _Collector(Collector):
        def collect(self) -> Iterator[Any]:
            yield InfoMetricFamily("nvtrain_run", "The run this pod serves.", value=info)
            for name, kind, text, value in pod.values():
                cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                own = cls(name, text, labels=["run_id", "node_rank"])
                own.add_metric([run_id, str(node_rank)], value)
                yield own
            failed = CounterMetricFamily(ERRORS_METRIC, ERRORS_HELP, labels=["run_id", "node_rank"])
            failed.add_metric([run_id, str(node_rank)], float(errors.count))
            yield failed
            if live is not None:
                yield from _job_families(live.served(), run_id)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    server, thread = start_server(config.port, address or "0.0.0.0", make_wsgi_app(registry))
    updater = threading.Thread(target=keep_fresh, name="nvtrain-metrics", daemon=True)
    updater.start()
    port = int(server.server_address[1])
    return MetricsServer(server, [thread, updater], stop, port, live, pod, errors)


def _job_families(served: list[tuple[Family, list[Sample]]], run_id: str) -> Iterator[Any]:
    """The job's figures (``LiveFigures.served``) as ``prometheus_client`` families, every
    sample labelled with ``run_id``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for fam, samples in served:
        names = sorted({k for _, labels, _ in samples for k in labels if k != "le"})
        if fam.kind == "histogram":
            yield _histogram(fam, samples, names, run_id)
            continue
        cls = CounterMetricFamily if fam.kind == "counter" else GaugeMetricFamily
        metric = cls(fam.name, fam.help, labels=["run_id", *names])
        for _, labels, value in samples:
            metric.add_metric([run_id, *(labels.get(k, "") for k in names)], value)
        yield metric


def _histogram(fam: Family, samples: list[Sample], names: list[str], run_id: str) -> Any:
    """A histogram family from its ``_bucket`` and ``_sum`` samples, one series per label set."""
    from prometheus_client.core import HistogramMetricFamily

    histogram = HistogramMetricFamily(fam.name, fam.help, labels=["run_id", *names])
    buckets: dict[tuple[str, ...], list[tuple[str, float]]] = {}
    sums: dict[tuple[str, ...], float] = {}
    for suffix, labels, value in samples:
        key = tuple(labels.get(k, "") for k in names)
        if suffix == "_bucket":
            buckets.setdefault(key, []).append((labels["le"], value))
        else:
            sums[key] = value
    for key, counts in buckets.items():
        histogram.add_metric([run_id, *key], counts, sums.get(key, 0.0))
    return histogram

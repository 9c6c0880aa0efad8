"""Live figures of a running job for Prometheus: what ``nvtrain report`` shows, while it runs.

``figures(report, now)`` turns a ``Report`` into metric families (pure, no Prometheus import);
``LiveFigures`` keeps the report of a growing events log up to date; ``serve`` exposes them over
HTTP with ``prometheus_client`` (imported only there) and rebuilds them in a thread of its own
every ``refresh`` seconds when the log grew, so a scrape never waits for a rebuild. Every pod
serves the whole job's figures, read from the shared events log, labelled with the run id:
aggregate with ``max by (run_id)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from nvtrain.events import EventTail
from nvtrain.events.records import Event
from nvtrain.report.model import Report, Stats, build_report
from nvtrain.runlog import RunLog

if TYPE_CHECKING:
    from nvtrain.config.schema import Metrics

__all__ = ["BUILD_SHARE", "Family", "LiveFigures", "MetricsServer", "bind_address", "figures", "serve"]

Kind = Literal["gauge", "counter"]
Labels = dict[str, str]


@dataclasses.dataclass(frozen=True)
class Family:
    """One metric: its name (counters without the ``_total`` suffix), kind, help and samples."""

    name: str
    kind: Kind
    help: str
    samples: tuple[tuple[Labels, float], ...]


_STATS = (("median", "median"), ("p95", "p95"), ("max", "max"))


def _stats(stats: Stats | None, **labels: str) -> list[tuple[Labels, float]]:
    if stats is None:
        return []
    return [({**labels, "stat": name}, float(getattr(stats, attr))) for name, attr in _STATS]


def figures(report: Report, now: float) -> list[Family]:
    """The metric families of ``report`` at unix time ``now`` (families without samples are left
    out, so a figure that is not known yet is absent rather than zero)."""
    r, ck = report, report.checkpoints
    out: list[Family] = []

    def add(name: str, kind: Kind, help: str, samples: list[tuple[Labels, float]]) -> None:
        if samples:
            out.append(Family(f"nvtrain_{name}", kind, help, tuple(samples)))

    def one(value: float | int | None) -> list[tuple[Labels, float]]:
        return [] if value is None else [({}, float(value))]

    add("job_seconds", "gauge", "Job time so far: the run's first event to its last.", one(r.time.total))
    steps = [t for t, _ in (p for s in r.segments for p in s.points)]
    reached = r.segments[-1].last_step if steps else None
    add("step", "gauge", "The step the workers reached last (it drops back after a restore).", one(reached))
    add(
        "last_step_age_seconds",
        "gauge",
        "Seconds since the workers last logged a step (grows during a hang or a recovery).",
        one(now - (r.start_ts + max(steps)) if steps else None),
    )
    add(
        "training_goodput_ratio",
        "gauge",
        "Time of the steps that were kept / total job time (docs/report.md).",
        one(r.training_goodput),
    )
    add(
        "infrastructure_goodput_ratio",
        "gauge",
        "Time the workers were up and usable / total job time (docs/report.md).",
        one(r.infrastructure_goodput),
    )
    add("kept_steps", "gauge", "Steps kept: up to the final step, each counted once.", one(r.kept_steps))
    add("lost_steps", "counter", "Steps executed and then rolled back by a restore.", one(r.lost_steps))
    add("incidents", "counter", "Faults (or restarts), each with its recovery.", one(len(r.incidents)))
    recovering = bool(r.incidents) and not r.incidents[-1].recovered and r.exit_code is None
    add("recovering", "gauge", "1 while the newest incident has not reached a step yet.", one(recovering))
    add(
        "restarts",
        "counter",
        "Restarts by recovery layer (in_process, in_job, launcher, pod).",
        [({"layer": k}, float(v)) for k, v in sorted(r.restarts_by_layer.items())],
    )
    add(
        "restarts_by_cause",
        "counter",
        "Restarts by the fault that caused them.",
        [({"cause": k}, float(v)) for k, v in sorted(r.restarts_by_cause.items())],
    )
    add("failed_restart_attempts", "counter", "Restarts that reached no step.", one(r.failed_attempts))
    add(
        "recovery_seconds",
        "gauge",
        "Fault to the first step after it, per layer: median, p95 and max.",
        [s for lay in r.layers for s in _stats(lay.total, layer=lay.layer)],
    )
    add(
        "recovery_phase_seconds",
        "gauge",
        "Recovery time per layer and phase (detection, teardown, rendezvous, start, restore, "
        "first_step): median, p95 and max.",
        [
            s
            for lay in r.layers
            for phase, stats in lay.phases.items()
            for s in _stats(stats, layer=lay.layer, phase=phase)
        ],
    )
    last = next((i.seconds for i in reversed(r.incidents) if i.seconds is not None), None)
    add("last_recovery_seconds", "gauge", "Recovery time of the newest recovered incident.", one(last))
    add("rollback_steps", "gauge", "Steps lost per incident: median, p95 and max.", _stats(r.rollback_steps))
    add(
        "checkpoint_saves",
        "counter",
        "Checkpoint saves by result (one save: every rank's save of one step).",
        [
            ({"result": k}, float(v))
            for k, v in (
                ("committed", ck.committed),
                ("partial", ck.partial),
                ("corrupt", ck.corrupt),
                ("failed", ck.failed),
            )
        ]
        if ck.saves
        else [],
    )
    add(
        "checkpoint_in_flight_at_faults",
        "counter",
        "Saves in flight at a soft fault: finished (kept) or dropped ([checkpoint] finish_in_flight).",
        [
            ({"result": "finished"}, float(ck.finished_at_faults)),
            ({"result": "dropped"}, float(ck.dropped_at_faults)),
        ]
        if ck.finished_at_faults or ck.dropped_at_faults
        else [],
    )
    add(
        "checkpoint_blocked_seconds",
        "gauge",
        "Seconds the training loop was blocked per save (slowest rank): median, p95 and max.",
        _stats(ck.blocked),
    )
    add(
        "checkpoint_background_seconds",
        "gauge",
        "Seconds per background write (staged to committed): median, p95 and max.",
        _stats(ck.background),
    )
    if ck.commits:
        t, step = ck.commits[-1]
        add("checkpoint_last_step", "gauge", "Step of the newest committed checkpoint.", one(step))
        add(
            "checkpoint_age_seconds",
            "gauge",
            "Seconds since the newest checkpoint was committed.",
            one(now - (r.start_ts + t)),
        )
        if reached is not None:
            add(
                "checkpoint_age_steps",
                "gauge",
                "Steps since the newest committed checkpoint: what a fault now would lose.",
                one(max(0, reached - step)),
            )
    add("exit_code", "gauge", "The run's exit code, once the launcher has exited.", one(r.exit_code))
    return out


BUILD_SHARE = 0.25
"""Largest share of one core that rebuilding the figures may take: after a build that took
``b`` seconds, the next starts no sooner than ``b / BUILD_SHARE`` seconds later."""


class LiveFigures:
    """The figures of an events log that grows while the job runs.

    ``update`` reads what was appended and rebuilds the report (one thread calls it, see
    ``serve``); ``report`` and ``families`` return the newest build at once, so a scrape never
    waits for a rebuild. The events are kept in memory as typed records (``__slots__``, short
    strings interned by the reader), and the report is built from them as ``nvtrain report``
    builds it (``nvtrain.runlog.RunLog``).
    """

    def __init__(self, events: Path, refresh: float, *, clock: Callable[[], float] = time.time) -> None:
        self._tail = EventTail(events)
        self._events: list[Event] = []  # every one valid: the reader checked them
        self._refresh = refresh
        self._clock = clock
        self._report: Report | None = None
        self._build_s = 0.0
        self._source = str(events)

    def update(self) -> bool:
        """Read the new events and rebuild the report if there were any; whether it rebuilt."""
        new = self._tail.poll()
        if not new:
            return False
        self._events.extend(new)
        start = time.perf_counter()
        report = build_report(RunLog(self._events, skipped=self._tail.skipped), self._source)
        self._build_s = time.perf_counter() - start
        self._report = report  # one reference assignment: readers see the old or the new one
        return True

    def pause(self) -> float:
        """Seconds to wait before the next ``update``: ``refresh``, or longer when builds are
        slow (see ``BUILD_SHARE``)."""
        return max(self._refresh, self._build_s / BUILD_SHARE)

    def report(self) -> Report | None:
        """The newest build; None before the first event."""
        return self._report

    def families(self) -> list[Family]:
        report = self._report
        return [] if report is None else figures(report, float(self._clock()))


class MetricsServer:
    """A running metrics endpoint and the thread that keeps its figures fresh; ``close`` stops both."""

    def __init__(
        self, server: Any, threads: list[threading.Thread], stop: threading.Event, port: int
    ) -> None:
        self._server = server
        self._threads = threads
        self._stop = stop
        self.port = port

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


def serve(config: Metrics, events: Path, *, run_id: str, node: int, address: str = "") -> MetricsServer:
    """Serve the live figures of ``events`` on ``config.port`` (every IPv4 address by default).

    ``OSError`` when the port cannot be bound; the caller names the policy key.
    """
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
    from prometheus_client.registry import Collector

    live = LiveFigures(events, config.refresh)
    stop = threading.Event()

    def keep_fresh() -> None:
        while True:
            # A log that cannot be read for a moment (shared storage) must not end the updates:
            # the figures then stay as they were, and their age figures keep growing.
            with contextlib.suppress(Exception):
                live.update()
            if stop.wait(live.pause()):
                return

    info = {"run_id": run_id, "node": str(node)}

    class _Collector(Collector):
        def collect(self) -> Iterator[Any]:
            yield InfoMetricFamily("nvtrain_run", "The run this pod serves.", value=info)
            for fam in live.families():
                names = sorted({k for labels, _ in fam.samples for k in labels})
                cls = CounterMetricFamily if fam.kind == "counter" else GaugeMetricFamily
                metric = cls(fam.name, fam.help, labels=["run_id", *names])
                for labels, value in fam.samples:
                    metric.add_metric([run_id, *(labels.get(k, "") for k in names)], value)
                yield metric

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    server, thread = start_http_server(config.port, addr=address or "0.0.0.0", registry=registry)
    updater = threading.Thread(target=keep_fresh, name="nvtrain-metrics", daemon=True)
    updater.start()
    return MetricsServer(server, [thread, updater], stop, int(server.server_address[1]))

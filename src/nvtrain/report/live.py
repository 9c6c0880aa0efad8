"""Live figures of a running job for Prometheus: what ``nvtrain report`` shows, while it runs.

``figures(report, now)`` turns a ``Report`` into metric families (pure, no Prometheus import);
``LiveFigures`` keeps the report of a growing events log up to date; ``serve`` exposes them over
HTTP with ``prometheus_client`` (imported only there) and rebuilds them in a thread of its own
every ``refresh`` seconds when the log grew, so a scrape never waits for a rebuild.

Job-level series once per job, pod-level ones per pod: the pod of node rank 0
(``pod_figures.JOB_VIEW_RANK``) serves the whole job's figures, read from every pod's events log
in the run directory (``nvtrain.runlog.RunTail``); every pod serves ``nvtrain_run_info`` and
the figures of its own log (``nvtrain.report.pod_figures``, label ``node_rank``). Every sample
is labelled with the run id: ``max by (run_id)`` keeps one series of a run when a replaced pod 0
and its predecessor overlap.

The contract (docs/report.md, "Metrics contract"): counters and histograms only go up. They
count what no longer changes: an incident (with its restarts and rollback) once it has ended, a
save's blocked time once the save has ended; and each series is served at the highest value it
had (``LiveFigures.served``). Counters exist from the first scrape, at 0 for every value of
their labels, which come from fixed sets; the labels of one counter partition what it counts,
so a sum over them counts each thing once (``initial_counters``: before the first build too).
Points in time are served as unix times (``*_timestamp_seconds``), the Prometheus way, so that
``time() - x`` is right even when the series is stale. Distributions are histograms (``SECONDS_BUCKETS``,
``STEPS_BUCKETS``), which add up across runs and over time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from nvtrain.events.records import Event
from nvtrain.report.model import PHASES, Report, build_report
from nvtrain.report.pod_figures import JOB_VIEW_RANK, PodFigures
from nvtrain.runlog import CAUSES, RunLog, RunTail, pod_events_file

if TYPE_CHECKING:
    from nvtrain.config.schema import Metrics

__all__ = [
    "BUILD_SHARE",
    "LAYERS",
    "SECONDS_BUCKETS",
    "STEPS_BUCKETS",
    "Family",
    "LiveFigures",
    "MetricsServer",
    "Sample",
    "bind_address",
    "figures",
    "initial_counters",
    "own_log",
    "serve",
]

Kind = Literal["gauge", "counter", "histogram"]
Labels = dict[str, str]
Sample = tuple[str, Labels, float]
"""One sample as served: the suffix of the family's name (``""``, ``_bucket``, ``_sum``), its
labels and its value."""

LAYERS = ("in_process", "in_job", "launcher", "pod")
"""The restart layers, the ``layer`` label of restarts and recoveries."""
SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""Upper bounds of the histograms of durations (seconds; ``+Inf`` follows): from a checkpoint
save that blocks for milliseconds to a recovery that waits for a replaced pod."""
STEPS_BUCKETS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0)
"""Upper bounds of the histogram of steps rolled back per incident (``+Inf`` follows)."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One metric: its name (counters without the ``_total`` suffix), kind, help and samples.

    A gauge's or a counter's ``samples`` hold one value per label set; a histogram's hold its
    observations, one per observed value, and ``buckets`` its upper bounds (``+Inf`` implied)."""

    name: str
    kind: Kind
    help: str
    samples: tuple[tuple[Labels, float], ...]
    buckets: tuple[float, ...] = ()

    def series(self) -> list[Sample]:
        """The samples as served: a histogram's as cumulative ``_bucket`` counts (label ``le``,
        ``+Inf`` last) and a ``_sum`` per label set (its ``_count`` is the ``+Inf`` bucket)."""
        if self.kind != "histogram":
            return [("", labels, value) for labels, value in self.samples]
        groups: dict[tuple[tuple[str, str], ...], list[float]] = {}
        for labels, value in self.samples:
            groups.setdefault(tuple(sorted(labels.items())), []).append(value)
        out: list[Sample] = []
        for key, values in groups.items():
            labels = dict(key)
            for bound in (*self.buckets, math.inf):
                count = sum(1 for v in values if v <= bound)
                out.append(("_bucket", {**labels, "le": _bound(bound)}, float(count)))
            out.append(("_sum", labels, float(sum(values))))
        return out


def _bound(bound: float) -> str:
    """A bucket's ``le`` as Prometheus' clients write it: ``0.5``, ``1.0``, ``+Inf``."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def figures(report: Report, now: float) -> list[Family]:
    """The metric families of ``report`` at unix time ``now``.

    A gauge that is not known yet (no step logged, no recovery yet) is left out rather than
    served as 0; counters are there from the start, at 0 for every value of their labels; a
    histogram's label set is there from its first observation."""
    r, ck = report, report.checkpoints
    out: list[Family] = []

    def add(
        name: str,
        kind: Kind,
        help: str,
        samples: Iterable[tuple[Labels, float]],
        buckets: tuple[float, ...] = (),
    ) -> None:
        samples = tuple(samples)
        if samples:
            out.append(Family(f"nvtrain_{name}", kind, help, samples, buckets))

    def one(value: float | int | None) -> list[tuple[Labels, float]]:
        return [] if value is None else [({}, float(value))]

    recovered = [i for i in r.incidents if i.seconds is not None]
    # An incident is counted once it ended (recovered, or the run finished): its cause, restarts
    # and rollback no longer change then. The one in progress has gauges of its own.
    ended = [i for i in r.incidents if i.recovered or r.finished]
    recovering = bool(r.incidents) and not r.incidents[-1].recovered and not r.finished
    add("job_seconds", "gauge", "Job time so far: the run's first event to its last.", one(r.time.total))
    steps = [t for t, _ in (p for s in r.segments for p in s.points)]
    reached = r.segments[-1].last_step if steps else None
    add("step", "gauge", "The step the workers reached last (it drops back after a restore).", one(reached))
    add(
        "last_step_timestamp_seconds",
        "gauge",
        "Unix time of the step the workers logged last (alert on time() minus it).",
        one(r.start_ts + max(steps) if steps else None),
    )
    add(
        "last_step_age_seconds",
        "gauge",
        "Seconds since the workers last logged a step (kept for old rules: use "
        "time() - nvtrain_last_step_timestamp_seconds).",
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
    add(
        "lost_steps",
        "counter",
        "Steps executed and then rolled back, counted when their incident ends.",
        one(sum(i.rollback_steps or 0 for i in ended)),
    )
    incidents = dict.fromkeys(CAUSES, 0)
    restarts = {(layer, cause): 0 for layer in LAYERS for cause in CAUSES}
    for inc in ended:
        incidents[inc.cause_kind] = incidents.get(inc.cause_kind, 0) + 1
        for layer, count in inc.restarts.items():
            key = (layer, inc.cause_kind)
            restarts[key] = restarts.get(key, 0) + count
    add(
        "incidents",
        "counter",
        "Incidents (a fault and its recovery) that ended, by cause.",
        (({"cause": cause}, float(n)) for cause, n in incidents.items()),
    )
    add("recovering", "gauge", "1 while the newest incident has not reached a step yet.", one(recovering))
    add(
        "recovery_restarts",
        "gauge",
        "Restarts so far of the incident being recovered (0 when none is).",
        one(sum(r.incidents[-1].restarts.values()) if recovering else 0),
    )
    add(
        "restarts",
        "counter",
        "Restarts of the incidents that ended, by layer and by the incident's cause (each counted once).",
        (({"layer": layer, "cause": cause}, float(n)) for (layer, cause), n in restarts.items()),
    )
    add(
        "failed_restart_attempts",
        "counter",
        "Restarts of the incidents that ended that reached no step.",
        one(sum(i.failed_attempts for i in ended)),
    )
    add(
        "recovery_seconds",
        "histogram",
        "Fault to the first step after it, per recovered incident, by the layer that recovered.",
        (({"layer": i.layer}, i.seconds) for i in recovered if i.seconds is not None),
        SECONDS_BUCKETS,
    )
    add(
        "recovery_phase_seconds",
        "histogram",
        f"Recovery time per recovered incident, by layer and phase ({', '.join(PHASES)}).",
        (
            ({"layer": i.layer, "phase": phase}, seconds)
            for i in recovered
            for phase, seconds in i.phases.items()
            if seconds is not None
        ),
        SECONDS_BUCKETS,
    )
    last = next((i.seconds for i in reversed(r.incidents) if i.seconds is not None), None)
    add("last_recovery_seconds", "gauge", "Recovery time of the newest recovered incident.", one(last))
    add(
        "rollback_steps",
        "histogram",
        "Steps rolled back per incident that ended.",
        (({}, float(i.rollback_steps)) for i in ended if i.rollback_steps is not None),
        STEPS_BUCKETS,
    )
    add(
        "checkpoint_saves",
        "counter",
        "Checkpoint saves begun (one save: every rank's save of one step).",
        one(ck.saves),
    )
    add("checkpoint_commits", "counter", "Checkpoint saves that ended in a commit.", one(ck.saves_committed))
    add(
        "checkpoint_problems",
        "counter",
        "Checkpoint problems: a save that failed, a partial or a corrupt checkpoint found.",
        (
            ({"problem": "failed"}, float(ck.failed)),
            ({"problem": "partial"}, float(ck.partial)),
            ({"problem": "corrupt"}, float(ck.corrupt)),
        ),
    )
    add(
        "checkpoint_in_flight_at_faults",
        "counter",
        "Saves in flight at a soft fault: finished (kept) or dropped ([checkpoint] finish_in_flight).",
        (
            ({"result": "finished"}, float(ck.finished_at_faults)),
            ({"result": "dropped"}, float(ck.dropped_at_faults)),
        ),
    )
    add(
        "checkpoint_blocked_seconds",
        "histogram",
        "Seconds the training loop was blocked per save (slowest rank).",
        (({}, v) for v in ck.blocked_each),
        SECONDS_BUCKETS,
    )
    add(
        "checkpoint_background_seconds",
        "histogram",
        "Seconds per background write (staged to committed).",
        (({}, v) for v in ck.background_each),
        SECONDS_BUCKETS,
    )
    if ck.commits:
        t, step = ck.commits[-1]
        add("checkpoint_last_step", "gauge", "Step of the newest committed checkpoint.", one(step))
        add(
            "checkpoint_last_commit_timestamp_seconds",
            "gauge",
            "Unix time at which the newest checkpoint was committed.",
            one(r.start_ts + t),
        )
        add(
            "checkpoint_age_seconds",
            "gauge",
            "Seconds since the newest checkpoint was committed (kept for old rules: use "
            "time() - nvtrain_checkpoint_last_commit_timestamp_seconds).",
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


def initial_counters() -> list[Family]:
    """The job's counters before anything is known: each at 0, for every value of its labels,
    as ``figures`` serves them once there are events. Served until the first build, so that the
    first scrape has them and ``increase()`` sees the first count."""
    return list(_initial_counters())


@functools.cache
def _initial_counters() -> tuple[Family, ...]:
    return tuple(f for f in figures(build_report([], "no events yet"), 0.0) if f.kind == "counter")


BUILD_SHARE = 0.25
"""Largest share of one core that rebuilding the figures may take: after a build that took
``b`` seconds, the next starts no sooner than ``b / BUILD_SHARE`` seconds later."""


class LiveFigures:
    """The figures of an events log that grows while the job runs.

    ``update`` reads what was appended and rebuilds the report (the server's thread calls it,
    see ``serve``, and ``MetricsServer.catch_up`` once the run has ended; one at a time);
    ``report``, ``families`` and ``served`` return the newest build at once, so a scrape never
    waits for a rebuild. The events are kept in memory as typed records (``__slots__``, short
    strings interned by the reader), and the report is built from them as ``nvtrain report``
    builds it (``nvtrain.runlog.RunLog``).
    """

    def __init__(self, events: Path, refresh: float, *, clock: Callable[[], float] = time.time) -> None:
        """``events``: the run directory (every pod's log), or one log file (``.jsonl``)."""
        self._tail = RunTail(events)
        self._events: list[Event] = []  # every one valid: the reader checked them
        self._refresh = refresh
        self._clock = clock
        self._report: Report | None = None
        self._build_s = 0.0
        self._source = str(events)
        self._updating = threading.Lock()
        self._served = _HighWater()

    def update(self) -> bool:
        """Read the new events and rebuild the report if there were any; whether it rebuilt.
        One update at a time (the server's thread, and ``MetricsServer.catch_up``)."""
        with self._updating:
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
        """``figures`` of the newest build, now."""
        report = self._report
        return [] if report is None else figures(report, float(self._clock()))

    def served(self) -> list[tuple[Family, list[Sample]]]:
        """What a scrape gets: each family of ``families`` with its samples (``Family.series``),
        counters and histograms held at the highest value each series had (``_HighWater``);
        before the first build, the counters at 0 (``initial_counters``)."""
        families = self.families() if self._report is not None else initial_counters()
        return self._served.hold(families)


class _HighWater:
    """Counters and histograms, as served, never go down.

    Each figure is worked out anew from the whole log, and a count can come out lower than
    before: an event written late by another node (events are ordered by their time stamps)
    may move a restart into another recovery, or a save's blocked time into another bucket once
    the slowest rank's event arrives. Prometheus would read a lower counter as a reset, so each
    series of a counter or a histogram is served at the highest value it had, and a series once
    served stays (a histogram's bucket counts stay cumulative: each is the highest of its own).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._high: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        self._families: dict[str, Family] = {}

    def hold(self, families: list[Family]) -> list[tuple[Family, list[Sample]]]:
        out: list[tuple[Family, list[Sample]]] = []
        with self._lock:
            for fam in families:
                if fam.kind == "gauge":
                    out.append((fam, fam.series()))
                    continue
                self._families[fam.name] = fam
                high = self._high.setdefault(fam.name, {})
                for suffix, labels, value in fam.series():
                    key = (suffix, tuple(sorted(labels.items())))
                    high[key] = max(value, high.get(key, value))
            for name, high in self._high.items():
                samples = [(suffix, dict(labels), value) for (suffix, labels), value in high.items()]
                out.append((self._families[name], samples))
        return out


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
    ) -> None:
        self._server = server
        self._threads = threads
        self._stop = stop
        self._live = live
        self._pod = pod
        self.port = port

    @property
    def job_view(self) -> bool:
        """Whether this endpoint serves the job's figures (the pod of ``JOB_VIEW_RANK``)."""
        return self._live is not None

    def catch_up(self) -> None:
        """Read the log to its end and rebuild the figures now, not at the next refresh: the
        run's last events (its exit code) are served at once. Never raises: the figures then
        stay as they were."""
        for each in (self._live, self._pod):
            if each is not None:
                with contextlib.suppress(Exception):
                    each.update()

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
    pod-level figures (``nvtrain.report.pod_figures``).

    ``OSError`` when the port cannot be bound; the caller names the policy key.
    """
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        InfoMetricFamily,
    )
    from prometheus_client.registry import Collector

    live = LiveFigures(events, config.refresh) if node_rank == JOB_VIEW_RANK else None
    pod = PodFigures(own_log(events, node_rank))
    stop = threading.Event()

    def keep_fresh() -> None:
        while True:
            # A log that cannot be read for a moment (shared storage) must not end the updates:
            # the figures then stay as they were.
            for each in (live, pod):
                if each is not None:
                    with contextlib.suppress(Exception):
                        each.update()
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
            for fam, samples in live.served() if live is not None else ():
                names = sorted({k for _, labels, _ in samples for k in labels if k != "le"})
                if fam.kind == "histogram":
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
                    yield histogram
                    continue
                cls = CounterMetricFamily if fam.kind == "counter" else GaugeMetricFamily
                metric = cls(fam.name, fam.help, labels=["run_id", *names])
                for _, labels, value in samples:
                    metric.add_metric([run_id, *(labels.get(k, "") for k in names)], value)
                yield metric

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    server, thread = start_http_server(config.port, addr=address or "0.0.0.0", registry=registry)
    updater = threading.Thread(target=keep_fresh, name="nvtrain-metrics", daemon=True)
    updater.start()
    return MetricsServer(server, [thread, updater], stop, int(server.server_address[1]), live, pod)

"""The job's figures for Prometheus: what ``nvtrain report`` shows, as metric families.

``figures(report, now)`` turns a ``Report`` into metric families, pure (no Prometheus import):
counters and histograms count what no longer changes, gauges are left out until known, points in
time are unix times (the contract: docs/report.md, "Metrics contract"). ``initial_counters`` are
the counters at 0, served before the first build.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable
from typing import Literal

from nvtrain.report.model import PHASES, Report, build_report
from nvtrain.runlog import CAUSES

__all__ = [
    "LAYERS",
    "SECONDS_BUCKETS",
    "STEPS_BUCKETS",
    "Family",
    "Kind",
    "Labels",
    "Sample",
    "figures",
    "initial_counters",
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

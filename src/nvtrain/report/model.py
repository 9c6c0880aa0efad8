"""What ``nvtrain report`` computes from a run's events log: pure functions, dataclasses out.

No I/O, no rendering and no reading of events here: ``build_report(log, source)`` takes what
``nvtrain.runlog.RunLog`` works out from a run's typed events and never raises. The definitions
(docs/report.md says more):

* **Total job time**: the first event of the run to its last, every node's events together.
* **Training goodput**: the time spent on the steps that were kept (every step up to the final
  one, each counted once; steps rolled back by a restore are not) over the total job time.
  A step's time is the wall time between two logged steps of one attempt, less the checkpoint
  saves that blocked the loop in between, spread evenly over the steps in between; the first
  step of an attempt (whose logged time includes the restore) counts as that stretch's median.
* **Infrastructure goodput**: the time the workers were up and usable over the total job time.
  An attempt is up from its first completed step until the next fault, or until the workers'
  last event when the run ends. Start-up, every recovery (detection, teardown, rendezvous, new
  processes, restore) and the final shut-down are not up.
* **Incidents**: faults and restarts grouped by the first completed step that follows them
  (``RunLog.recoveries``, which ``tune-interval --from-run`` measures too), each with its
  phases, restarts, rollback distance and the checkpoint freshness at the fault.
"""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence

from nvtrain.events.records import Event
from nvtrain.runlog import Cause, LeftOut, Recovery, RunLog

__all__ = [
    "INFRASTRUCTURE_GOODPUT",
    "PHASES",
    "TOTAL_JOB_TIME",
    "TRAINING_GOODPUT",
    "Checkpoints",
    "Incident",
    "LayerRecovery",
    "Report",
    "Segment",
    "Stats",
    "TimeSplit",
    "build_report",
]

TOTAL_JOB_TIME = "the run's first event to its last (launcher_start to launcher_exit), every node's together"
TRAINING_GOODPUT = (
    "time of the steps that were kept (up to the final step, each counted once; rolled-back steps "
    "excluded) / total job time"
)
INFRASTRUCTURE_GOODPUT = (
    "time the workers were up (each attempt's first completed step to its fault, or to the "
    "workers' last event) / total job time; start-up, recoveries and shut-down are not up"
)

PHASES = ("detection", "teardown", "rendezvous", "start", "restore", "first_step")
"""Recovery phases, each ending at one event: ``restart_begin`` (or the launcher seeing the
worker fail), ``restart_end`` (in-process), ``rendezvous_done`` (in-job), ``attempt_start``,
``checkpoint_restored``, the first completed step."""


@dataclasses.dataclass(frozen=True, slots=True)
class Stats:
    """A distribution: median, 95th percentile, maximum, total and the number of samples."""

    count: int
    median: float
    p95: float
    max: float
    total: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Stats | None:
        """The distribution of ``values``; None when there are none. The 95th percentile is
        interpolated (inclusive), as ``nvtrain.tuning.measured`` does."""
        data = sorted(float(v) for v in values)
        if not data:
            return None
        p95 = data[0] if len(data) == 1 else statistics.quantiles(data, n=20, method="inclusive")[18]
        return cls(len(data), float(statistics.median(data)), float(p95), float(data[-1]), float(sum(data)))


@dataclasses.dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of training between two recoveries (one attempt, every rank merged)."""

    start_t: float | None
    """The first completed step (seconds since the job started); None when none was logged."""
    end_t: float
    """The next fault, or the workers' last event when the run ended."""
    restored_step: int
    """The step it resumed after (0: from scratch)."""
    last_step: int
    """The last step it reached (a logged step, or the step an injected fault fired at)."""
    kept_to: int
    """Its steps up to this one were kept; the ones after it were rolled back later."""
    points: tuple[tuple[float, int], ...]
    """Logged steps: (seconds since the job started, step)."""
    intervals: tuple[tuple[int, int, float], ...]
    """(after step, to step, seconds per step) covering ``restored_step`` to ``last_step``."""

    def work(self, after: int, to: int) -> float:
        """Training time of the steps ``after`` < step <= ``to`` in this segment."""
        return sum(max(0, min(b, to) - max(a, after)) * per for a, b, per in self.intervals)


@dataclasses.dataclass(frozen=True, slots=True)
class Incident:
    """One fault (or restart) and the recovery from it."""

    index: int
    layer: str
    """The layer whose restart recovered: in_process, in_job, launcher, pod; none."""
    cause: str
    """What it answered, in words (``Recovery.cause``)."""
    cause_kind: Cause
    """The same as one of ``nvtrain.runlog.CAUSES`` (the metrics' ``cause`` label)."""
    start_t: float
    """The fault (or the first restart when no fault was logged), seconds since the job start."""
    end_t: float | None
    """The first completed step after it; None when it was not recovered."""
    fault_logged: bool
    phases: dict[str, float | None]
    """Seconds per phase (``PHASES``); None when its event is missing (the next phase then
    starts at the last event seen) or the layer has no such phase."""
    restarts: dict[str, int]
    """Restarts per layer, counted once across ranks and nodes."""
    failed_attempts: int
    """Restarts that reached no completed step: every one but the last when it recovered or
    while it goes on (the last may still succeed); every one when the run finished without
    recovering."""
    last_step: int | None
    """The last step reached before the fault."""
    restored_step: int | None
    restore_source: str | None
    """Where the restore read the checkpoint (``Recovery.restored_from``): ``memory``, ``peer``
    or ``storage``, the slowest that any rank read from; None when nothing says."""
    restore_load_s: float | None
    """The slowest load of the incident, of any rank and attempt (``checkpoint_restored.seconds``,
    as ``Recovery.restore_s``); the rest of the ``restore`` phase is the script's own work before
    it (building the model, the optimizer, a trainer). None when no load says."""
    rollback_steps: int | None
    """``last_step`` less the step it resumed after (the newest committed one if not recovered)."""
    lost_s: float | None
    """Training time of the rolled-back steps."""
    freshness_steps: int | None
    """Steps since the newest committed checkpoint, at the fault."""
    freshness_s: float | None
    """Training time since the newest committed checkpoint's step, at the fault."""

    @property
    def recovered(self) -> bool:
        return self.end_t is not None

    @property
    def seconds(self) -> float | None:
        """Fault to the first completed step; None when not recovered."""
        return None if self.end_t is None else self.end_t - self.start_t


@dataclasses.dataclass(frozen=True, slots=True)
class LayerRecovery:
    """Recovery times of one layer's recovered incidents."""

    layer: str
    total: Stats
    phases: dict[str, Stats | None]


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoints:
    """The run's saves: one save is every rank's save of one step in one attempt."""

    saves: int
    committed: int
    partial: int
    corrupt: int
    failed: int
    blocked: Stats | None
    """Seconds the loop was blocked per save (the slowest rank)."""
    blocked_each: tuple[float, ...]
    """The same, each save's that ended (committed or failed), once every rank's part is in."""
    waited: Stats | None
    """Of which waiting for the previous save's write, when it did."""
    background: Stats | None
    """Seconds per background write (staged to committed)."""
    background_each: tuple[float, ...]
    """The same, each write's."""
    saves_committed: int
    """Saves that ended in a commit (``committed`` leaves out the commits found damaged later)."""
    finished_at_faults: int
    """Saves in flight at a soft fault that every rank let finish (kept)."""
    dropped_at_faults: int
    """Saves in flight at a soft fault that did not finish in time (dropped)."""
    settle_waited: Stats | None
    """Seconds waited for a save in flight at a soft fault (the slowest rank)."""
    commits: tuple[tuple[float, int], ...]
    """(seconds since the job started, step) of each commit."""


@dataclasses.dataclass(frozen=True, slots=True)
class TimeSplit:
    """Where the total job time went: start-up + up + recovering + shut-down."""

    total: float
    startup: float | None
    up: float | None
    recovering: float
    shutdown: float | None


@dataclasses.dataclass(frozen=True)
class Report:
    """Everything ``nvtrain report`` shows, from one events log."""

    source: str
    run_id: str | None
    start_ts: float
    """Unix time of the first event; every other time is seconds after it."""
    nodes: int
    ranks: int | None
    exit_code: int | None
    time: TimeSplit
    training_goodput: float | None
    infrastructure_goodput: float | None
    training_goodput_with_replays: float | None
    """What training goodput would be if rolled-back steps counted (as the reference does)."""
    final_step: int | None
    kept_steps: int
    kept_s: float
    executed_steps: int
    lost_steps: int
    lost_s: float
    step_s: float | None
    """Median training time per step."""
    incidents: tuple[Incident, ...]
    layers: tuple[LayerRecovery, ...]
    restarts_by_layer: dict[str, int]
    restarts_by_cause: dict[str, int]
    failed_attempts: int
    rollback_steps: Stats | None
    rollback_s: Stats | None
    freshness_steps: Stats | None
    """Steps since the newest committed checkpoint, at each fault."""
    freshness_s: Stats | None
    freshness: tuple[tuple[float, int, float], ...]
    """(seconds since the job started, steps, seconds) since the newest committed checkpoint."""
    checkpoints: Checkpoints
    segments: tuple[Segment, ...]
    notes: tuple[str, ...]
    skipped_lines: int = 0
    """Lines of the log that were skipped as not valid events (``nvtrain.events.parse_event``)."""
    finished: bool = False
    """Every node's launcher logged its exit after its last start (``RunLog.finished``)."""
    left_out: tuple[LeftOut, ...] = ()
    """Events of another run found in the log and left out (``nvtrain.runlog.read_log``)."""
    warnings: tuple[str, ...] = ()
    """What the reader of the report must know: one line per file with another run's events."""


# -- building ---------------------------------------------------------------------------------


def build_report(events: RunLog | Iterable[Event], source: str, *, skipped: int | None = None) -> Report:
    """The report of ``events`` (a ``RunLog``, or records as ``read_events`` returns them;
    ``skipped`` lines of the log were not valid events, ``Events.skipped`` when not given);
    never raises. Linear in the events (after sorting them by time): nothing here scans all
    events, or all commits, once per incident."""
    log = events if isinstance(events, RunLog) else RunLog(events)
    skipped = log.skipped if skipped is None else skipped
    t0, total = log.t0, log.total
    everything = log.recoveries
    recovered = [r for r in everything if r.end is not None]
    unrecovered = next((r for r in everything if r.end is None), None)
    commits = _Commits([(t - t0, step) for t, step in log.commits])
    last_worker = log.last_worker_ts

    # Each stretch of training: its logged steps, and the time per step between them.
    stretches = log.stretches
    measured = [per for s in stretches for _, _, per in s.intervals]
    default = statistics.median(measured) if measured else _logged_step_s(log)
    ends = [r.start for r in recovered]
    ends.append(unrecovered.start if unrecovered else last_worker)
    segments: list[Segment] = []
    for k, stretch in enumerate(stretches):
        r, points, intervals = stretch.resumed, stretch.points, list(stretch.intervals)
        last = max([r, *(step for _, step in points)])
        own = [per for _, _, per in intervals]
        estimate = statistics.median(own) if own else default
        first = [(r, points[0][1], estimate)] if points and points[0][1] > r else []
        # The first completed step; a stretch whose only mark is an injected fault starts there.
        started = stretch.first_step
        if started is None and points:
            started = min(t for t, _ in points)
        segments.append(
            Segment(
                start_t=None if started is None else started - t0,
                end_t=ends[k] - t0,
                restored_step=r,
                last_step=last,
                kept_to=last,
                points=tuple((t - t0, step) for t, step in points),
                intervals=tuple(first + intervals),
            )
        )

    # Where each recovery went back to: the step the next stretch resumed after; for a fault the
    # run did not recover from, the restore it logged, else the newest committed checkpoint.
    back_to = [s.resumed for s in stretches[1:]]
    if unrecovered is not None:
        point = unrecovered.restored_step
        back_to.append(point if point is not None else commits.newest(segments[-1], ends[-1] - t0)[0])
    in_order = [*recovered, *([unrecovered] if unrecovered else [])]
    incidents = [
        _incident(recovery, i + 1, segments[i], back_to[i], commits, t0, log.finished)
        for i, recovery in enumerate(in_order)
    ]
    # A step is kept unless a later recovery went back before it (the lowest of back_to[k:]).
    lowest: int | None = None
    for k in reversed(range(len(segments))):
        if k < len(back_to):
            lowest = back_to[k] if lowest is None else min(lowest, back_to[k])
        seg = segments[k]
        segments[k] = dataclasses.replace(
            seg, kept_to=seg.last_step if lowest is None else min(seg.last_step, lowest)
        )

    kept_s = sum(s.work(s.restored_step, s.kept_to) for s in segments)
    lost_s = sum(s.work(max(s.restored_step, s.kept_to), s.last_step) for s in segments)
    kept_steps = sum(max(0, s.kept_to - s.restored_step) for s in segments)
    executed = sum(max(0, s.last_step - s.restored_step) for s in segments)
    has_steps = any(s.points for s in segments)
    split = _time_split(segments, incidents, total, last_worker - t0, has_steps)
    by_layer: Counter[str] = Counter()
    by_cause: Counter[str] = Counter()
    for inc in incidents:
        by_layer.update(inc.restarts)
        by_cause[inc.cause] += sum(inc.restarts.values())

    def share(x: float | None) -> float | None:
        return None if x is None or total <= 0 or not has_steps else x / total

    return Report(
        source=source,
        run_id=log.run_id,
        start_ts=t0,
        nodes=log.nodes,
        ranks=log.ranks,
        exit_code=log.exit_code,
        time=split,
        training_goodput=share(kept_s),
        infrastructure_goodput=share(split.up),
        training_goodput_with_replays=share(kept_s + lost_s),
        final_step=max(s.kept_to for s in segments) if has_steps else None,
        kept_steps=kept_steps,
        kept_s=kept_s,
        executed_steps=executed,
        lost_steps=executed - kept_steps,
        lost_s=lost_s,
        step_s=statistics.median(measured) if measured else None,
        incidents=tuple(incidents),
        layers=_layers(incidents),
        restarts_by_layer=dict(by_layer),
        restarts_by_cause=dict(by_cause),
        failed_attempts=sum(i.failed_attempts for i in incidents),
        rollback_steps=Stats.of(i.rollback_steps for i in incidents if i.rollback_steps is not None),
        rollback_s=Stats.of(i.lost_s for i in incidents if i.lost_s is not None),
        freshness_steps=Stats.of(i.freshness_steps for i in incidents if i.freshness_steps is not None),
        freshness_s=Stats.of(i.freshness_s for i in incidents if i.freshness_s is not None),
        freshness=_freshness_series(segments, commits),
        checkpoints=_checkpoints(log, commits.commits),
        segments=tuple(segments),
        notes=_notes(log, segments, incidents, has_steps, skipped),
        skipped_lines=skipped,
        finished=log.finished,
    )


# -- parts -------------------------------------------------------------------------------------


def _logged_step_s(log: RunLog) -> float:
    """The median ``step_s`` logged (as ``tune-interval`` measures it), for stretches too short
    to time steps from their time stamps; 0 when none was logged."""
    logged = log.step_times
    return float(statistics.median(max(v, 1e-6) for v in logged)) if logged else 0.0


class _Commits:
    """The run's commits, (seconds since the start, step) oldest first, found by time."""

    def __init__(self, commits: Sequence[tuple[float, int]]) -> None:
        self.commits = commits
        self.times = [t for t, _ in commits]

    def between(self, start: float, end: float) -> Sequence[tuple[float, int]]:
        """The commits at ``start`` <= t <= ``end``."""
        return self.commits[bisect.bisect_left(self.times, start) : bisect.bisect_right(self.times, end)]

    def newest(self, seg: Segment, at: float) -> tuple[int, float | None]:
        """The newest checkpoint committed by time ``at`` that ``seg`` could go back to, and
        when its step was reached (the restored one counts: it was committed before)."""
        since = seg.start_t if seg.start_t is not None else float("-inf")
        newer = [c for _, c in self.between(since, at) if seg.restored_step < c <= seg.last_step]
        if not newer:
            return seg.restored_step, seg.start_t
        step = max(newer)
        return step, next((t for t, s in seg.points if s == step), seg.start_t)


_DEPTH = {"in_process": 0, "in_job": 1, "launcher": 2, "pod": 3}
"""How deep a restart layer reaches: each restarts everything the ones above it do."""


def _incident(
    recovery: Recovery, index: int, seg: Segment, back_to: int, commits: _Commits, t0: float, finished: bool
) -> Incident:
    start, end = recovery.start, recovery.end
    restarts = recovery.restarts
    if restarts:
        # The deepest layer that restarted recovered: when ft_launcher restarts every worker,
        # the survivors' in-process restarts logged a few ms later did not.
        layer = max(restarts, key=lambda name: _DEPTH.get(name, 1))
    else:
        layer = recovery.layer if end is not None else "none"
    # Each phase ends at one event; detection is measured only from a logged fault.
    milestones = {
        "detection": recovery.detected,
        "teardown": recovery.torn_down,
        "rendezvous": recovery.rendezvous,
        "start": recovery.attempt,
        "restore": recovery.restored,
        "first_step": end,
    }
    phases: dict[str, float | None] = {}
    previous = start
    for name, at in milestones.items():
        if at is None or at < previous:
            phases[name] = None
            continue
        phases[name] = at - previous
        previous = at
    has_steps = bool(seg.points) or seg.restored_step > 0
    last = seg.last_step if has_steps else None
    restored_step = recovery.restored_step
    if restored_step is None and end is not None:
        restored_step = back_to
    fresh_step, fresh_t = commits.newest(seg, start - t0)
    rollback = None if last is None else max(0, last - back_to)
    lost = None if last is None else seg.work(max(seg.restored_step, back_to), last)
    return Incident(
        index=index,
        layer=layer,
        cause=recovery.cause,
        cause_kind=recovery.cause_kind,
        start_t=start - t0,
        end_t=None if end is None else end - t0,
        fault_logged=recovery.fault_logged,
        phases=phases,
        restarts=dict(Counter(restarts)),
        failed_attempts=len(restarts) if end is None and finished else max(0, len(restarts) - 1),
        last_step=last,
        restored_step=restored_step,
        restore_source=recovery.restored_from,
        restore_load_s=recovery.restore_s if recovery.restored is not None and recovery.restore_s else None,
        rollback_steps=rollback,
        lost_s=lost,
        freshness_steps=None if last is None else last - fresh_step,
        freshness_s=None if last is None or fresh_t is None else max(0.0, start - t0 - fresh_t),
    )


def _time_split(
    segments: Sequence[Segment],
    incidents: Sequence[Incident],
    total: float,
    last_worker: float,
    has_steps: bool,
) -> TimeSplit:
    recovering = sum((total if i.end_t is None else i.end_t) - i.start_t for i in incidents)
    if not has_steps:
        return TimeSplit(total, None, None, recovering, None)
    first = segments[0].start_t
    startup = first if first is not None else (incidents[0].start_t if incidents else total)
    up = sum(max(0.0, s.end_t - s.start_t) for s in segments if s.start_t is not None)
    ended = not incidents or incidents[-1].recovered
    return TimeSplit(total, startup, up, recovering, max(0.0, total - last_worker) if ended else 0.0)


def _layers(incidents: Sequence[Incident]) -> tuple[LayerRecovery, ...]:
    done = [i for i in incidents if i.seconds is not None]
    out = []
    for layer in dict.fromkeys(i.layer for i in done):
        mine = [i for i in done if i.layer == layer]
        total = Stats.of(i.seconds for i in mine if i.seconds is not None)
        assert total is not None
        phases = {p: Stats.of(v for i in mine if (v := i.phases.get(p)) is not None) for p in PHASES}
        out.append(LayerRecovery(layer, total, phases))
    return tuple(out)


def _freshness_series(segments: Sequence[Segment], commits: _Commits) -> tuple[tuple[float, int, float], ...]:
    """Steps and seconds since the newest committed checkpoint's step, at every logged step, at
    every commit (just before and just after it) and at the fault that ends each stretch."""
    series: list[tuple[float, int, float]] = []
    for seg in segments:
        if seg.start_t is None or not seg.points:
            continue
        times = [t for t, _ in seg.points]
        reached = {s: t for t, s in seg.points}
        newest, newest_t = seg.restored_step, seg.start_t
        changes = [(t, s, False) for t, s in seg.points]
        changes += [(t, c, True) for t, c in commits.between(seg.start_t, seg.end_t) if c > seg.restored_step]
        for t, step, committed in sorted(changes):
            if not committed:
                series.append((t, step - newest, t - newest_t))
                continue
            current = _step_at(seg.points, times, t)
            if newest < step <= current:
                series.append((t, round(current - newest), t - newest_t))
                newest, newest_t = step, reached.get(step, t)
                series.append((t, round(current - newest), t - newest_t))
        series.append((seg.end_t, seg.last_step - newest, seg.end_t - newest_t))
    return tuple(series)


def _step_at(points: Sequence[tuple[float, int]], times: Sequence[float], t: float) -> float:
    """The step a stretch had reached at time ``t``, between two logged steps."""
    i = bisect.bisect_right(times, t)
    if i == 0:
        return float(points[0][1])
    if i >= len(points):
        return float(points[-1][1])
    (ta, sa), (tb, sb) = points[i - 1], points[i]
    return sa + (sb - sa) * (t - ta) / (tb - ta) if tb > ta else float(sb)


def _checkpoints(log: RunLog, commits: Sequence[tuple[float, int]]) -> Checkpoints:
    saves = log.saves
    return Checkpoints(
        saves=saves.count,
        committed=len(commits),
        partial=saves.partial,
        corrupt=saves.corrupt,
        failed=saves.failed,
        blocked=Stats.of(saves.blocked),
        blocked_each=saves.blocked_ended,
        waited=Stats.of(saves.waited),
        background=Stats.of(saves.background),
        background_each=saves.background,
        saves_committed=saves.committed,
        finished_at_faults=sum(1 for _, ok in saves.settled if ok),
        dropped_at_faults=sum(1 for _, ok in saves.settled if not ok),
        settle_waited=Stats.of(w for w, _ in saves.settled),
        commits=tuple(commits),
    )


def _notes(
    log: RunLog,
    segments: Sequence[Segment],
    incidents: Sequence[Incident],
    has_steps: bool,
    skipped: int,
) -> tuple[str, ...]:
    notes = []
    if skipped:
        notes.append(
            f"skipped {skipped} malformed event line{'s' if skipped != 1 else ''} (not a JSON object with a "
            "finite `ts`, a string `event` and finite numbers in its numeric fields); the figures leave "
            f"{'them' if skipped != 1 else 'it'} out"
        )
    if not has_steps:
        notes.append(
            "no `step` events: the script does not use nvtrain's worker library, so goodput, "
            "rollback and freshness cannot be computed"
        )
    if not log.ended:
        notes.append(
            "no launcher_exit: the run is still going, or its launcher was killed; "
            "the job time ends at the last event"
        )
    if segments and segments[0].restored_step > 0:
        notes.append(
            f"the run started from step {segments[0].restored_step} (a checkpoint older than this log); "
            "the steps before it are not counted"
        )
    for i in incidents:
        if not i.recovered:
            notes.append(
                f"incident {i.index} ({i.cause}) was not recovered: no step completed after it "
                "(the run ended, or is still recovering)"
            )
    return tuple(notes)

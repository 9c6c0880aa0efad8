"""The report's PNG timeline: steps over time with faults, recoveries and checkpoints, and the
checkpoint freshness below. matplotlib (the ``report`` extra) is imported only when drawing."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvtrain.errors import UsageError

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from nvtrain.report.model import Report, Segment

__all__ = ["TIMELINE_FILE", "write_timeline"]

TIMELINE_FILE = "report-timeline.png"
"""Name of the PNG written next to the events log."""

_LAYER_COLOURS = {
    "in_process": "#f28e2b",
    "in_job": "#b07aa1",
    "launcher": "#9c755f",
    "pod": "#76b7b2",
}
_KEPT, _LOST, _FAULT, _COMMIT = "#4e79a7", "#e15759", "#d62728", "#59a14f"


def write_timeline(report: Report, path: Path) -> Path:
    """Draw ``report`` into the PNG ``path``; ``UsageError`` (exit 2) when matplotlib is missing
    or the file cannot be written."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(
            "the PNG timeline needs matplotlib, which is not installed",
            "install the report extra (pip install 'nvtrain[report]'), or add --no-timeline",
        ) from None
    unit, scale = _unit(report.time.total)
    fig = Figure(figsize=(13, 7.2), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    steps_ax, fresh_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1.2))
    _draw_phases(steps_ax, report, scale)
    _draw_phases(fresh_ax, report, scale, labels=False)
    _draw_steps(steps_ax, report, scale)
    _draw_freshness(fresh_ax, report, scale)
    steps_ax.set_ylabel("step")
    steps_ax.set_title(_title(report), loc="left", fontsize=11)
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    steps_ax.grid(alpha=0.3)
    fresh_ax.set_ylabel("steps since newest\ncommitted checkpoint", fontsize=9)
    fresh_ax.set_xlabel(f"time since the job started ({unit})")
    fresh_ax.grid(alpha=0.3)
    fresh_ax.set_xlim(0, report.time.total / scale if report.time.total > 0 else 1)
    fresh_ax.set_ylim(bottom=0)
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise UsageError(
            f"cannot write the timeline {path} ({exc.strerror or exc})",
            "give a writable path with --timeline PATH, or add --no-timeline",
        ) from None
    return path


def _unit(total: float) -> tuple[str, float]:
    if total < 600:
        return "s", 1.0
    if total < 36_000:
        return "min", 60.0
    return "h", 3600.0


def _title(report: Report) -> str:
    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1%}"

    run = f"run {report.run_id}" if report.run_id else report.source
    return (
        f"nvtrain report: {run}\n"
        f"training goodput {pct(report.training_goodput)}, "
        f"infrastructure goodput {pct(report.infrastructure_goodput)}, "
        f"{len(report.incidents)} incident(s), {report.lost_steps} step(s) rolled back"
    )


def _draw_phases(ax: Axes, report: Report, scale: float, *, labels: bool = True) -> None:
    """Start-up, recoveries (coloured by layer), shut-down as spans; faults as red lines."""
    total = report.time.total
    shown: set[str] = set()

    def span(start: float, end: float, colour: str, label: str, **kwargs: Any) -> None:
        name = label if labels and label not in shown else None
        shown.add(label)
        ax.axvspan(start / scale, end / scale, color=colour, alpha=0.18, lw=0, label=name, **kwargs)

    if report.time.startup:
        span(0.0, report.time.startup, "#bab0ac", "start-up / shut-down", hatch="//")
    if report.time.shutdown:
        span(total - report.time.shutdown, total, "#bab0ac", "start-up / shut-down", hatch="//")
    for inc in report.incidents:
        end = inc.end_t if inc.end_t is not None else total
        span(inc.start_t, end, _LAYER_COLOURS.get(inc.layer, "#ff9da7"), f"recovery: {inc.layer}")
        name = "fault" if labels and "fault" not in shown else None
        shown.add("fault")
        ax.axvline(inc.start_t / scale, color=_FAULT, lw=1.2, ls="--", label=name)
        if labels:
            ax.annotate(
                f"#{inc.index} {inc.cause}",
                xy=(inc.start_t / scale, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -3),
                textcoords="offset points",
                rotation=90,
                va="top",
                fontsize=8,
                color=_FAULT,
            )


def _draw_steps(ax: Axes, report: Report, scale: float) -> None:
    """Each stretch's steps, kept in blue and rolled back in red; the jump back at each restore."""
    labelled: set[str] = set()

    def label(name: str) -> str | None:
        if name in labelled:
            return None
        labelled.add(name)
        return name

    previous: tuple[float, int] | None = None
    for seg in report.segments:
        if not seg.points:
            continue
        kept, lost = _split_line(seg)
        if previous is not None:  # from the last step before the fault to the resumed one
            ax.plot(
                [previous[0] / scale, seg.points[0][0] / scale],
                [previous[1], seg.points[0][1]],
                color="grey",
                ls=":",
                lw=1,
                label=label("down: fault to next step"),
            )
        if kept:
            ax.plot(*_xy(kept, scale), color=_KEPT, lw=2, marker=".", ms=4, label=label("steps kept"))
        if lost:
            ax.plot(*_xy(lost, scale), color=_LOST, lw=2, marker=".", ms=4, label=label("steps rolled back"))
        previous = (seg.end_t, seg.last_step)
    commits = report.checkpoints.commits
    if commits:
        ax.scatter(
            [t / scale for t, _ in commits],
            [step for _, step in commits],
            marker="D",
            s=22,
            color=_COMMIT,
            zorder=3,
            label="checkpoint committed",
        )
    for inc in report.incidents:
        if inc.end_t is not None and inc.restored_step is not None:
            ax.annotate(
                f"resumed after {inc.restored_step}",
                xy=(inc.end_t / scale, inc.restored_step),
                xytext=(4, -10),
                textcoords="offset points",
                fontsize=7,
                color="dimgrey",
            )


def _split_line(seg: Segment) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """The segment's (time, step) line cut where its kept steps end."""
    points = [(t, float(s)) for t, s in seg.points]
    if seg.last_step > points[-1][1]:
        points.append((seg.end_t, float(seg.last_step)))
    kept = [p for p in points if p[1] <= seg.kept_to]
    lost = [p for p in points if p[1] > seg.kept_to]
    if kept and lost:  # meet where the kept steps end
        (ta, sa), (tb, sb) = kept[-1], lost[0]
        if sa < seg.kept_to:
            cut = (ta + (seg.kept_to - sa) / (sb - sa) * (tb - ta), float(seg.kept_to))
            kept.append(cut)
        lost.insert(0, kept[-1])
    return kept, lost


def _xy(points: list[tuple[float, float]], scale: float) -> tuple[list[float], list[float]]:
    return [t / scale for t, _ in points], [s for _, s in points]


def _draw_freshness(ax: Axes, report: Report, scale: float) -> None:
    series = report.freshness
    if not series:
        ax.text(0.5, 0.5, "no steps logged", transform=ax.transAxes, ha="center", color="grey")
        return
    for seg in report.segments:  # one line per stretch of training
        if seg.start_t is None:
            continue
        mine = [(t / scale, float(n)) for t, n, _ in series if seg.start_t <= t <= seg.end_t]
        if not mine:
            continue
        xs, ys = [x for x, _ in mine], [y for _, y in mine]
        ax.fill_between(xs, ys, color=_KEPT, alpha=0.25, lw=0)
        ax.plot(xs, ys, color=_KEPT, lw=1.2)
    for inc in report.incidents:
        if inc.freshness_steps is not None:
            ax.plot(inc.start_t / scale, inc.freshness_steps, marker="x", color=_FAULT, ms=7, mew=2)

"""The report's PNG timeline: steps over time with faults, recoveries and checkpoints, and the
checkpoint freshness below. matplotlib (the ``report`` extra) is imported only when drawing."""

from __future__ import annotations

import bisect
import contextlib
import io
import logging
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvtrain.atomic import write_atomically
from nvtrain.errors import UsageError

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from nvtrain.report.model import Report, Segment

__all__ = ["TIMELINE_FILE", "can_draw", "write_timeline"]

TIMELINE_FILE = "report-timeline.png"
"""Name of the PNG written next to the events log."""

_LAYER_COLOURS = {
    "in_process": "#f28e2b",
    "in_job": "#b07aa1",
    "launcher": "#9c755f",
    "pod": "#76b7b2",
}
_KEPT, _LOST, _FAULT, _COMMIT = "#4e79a7", "#e15759", "#d62728", "#59a14f"


def can_draw() -> bool:
    """Whether matplotlib is there to draw the timeline (found, not imported)."""
    import importlib.util

    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def write_timeline(report: Report, path: Path) -> Path:
    """Draw ``report`` into the PNG ``path``, written whole (``write_atomically``: a failed write
    leaves the file that was there); ``UsageError`` (exit 2) when matplotlib is missing or the
    file cannot be written. matplotlib says nothing meanwhile (``_quiet``)."""
    with _quiet():
        png = _draw(report)
    try:
        write_atomically(path, png)
    except OSError as exc:
        raise UsageError(
            f"cannot write the timeline {path} ({exc.strerror or exc})",
            "give a writable path with --timeline PATH, or add --no-timeline",
        ) from None
    return path


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """matplotlib's warnings and log records stay unprinted while it is imported and draws: the
    temporary cache folder it makes when its config folder is not writable (``MPLCONFIGDIR``,
    ``~/.config/matplotlib``), a font it cannot find, a layout it cannot fit. The PNG is drawn
    all the same; none of these is the report's reader's concern."""
    logger = logging.getLogger("matplotlib")
    handler, propagate = logging.NullHandler(), logger.propagate
    logger.addHandler(handler)  # a handler: the records do not reach logging's last resort (stderr)
    logger.propagate = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _draw(report: Report) -> bytes:
    """The PNG of ``report``'s timeline."""
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
    png = io.BytesIO()
    fig.savefig(png, format="png")
    return png.getvalue()


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


_MAX_LABELS = 40
"""Faults are labelled with their cause, and restores with the step they resumed after, when the
run has at most this many incidents: more labels would only cover each other."""


def _draw_phases(ax: Axes, report: Report, scale: float, *, labels: bool = True) -> None:
    """Start-up, recoveries (coloured by layer), shut-down as spans; faults as red lines. One
    collection per kind, not one artist per incident, so a run of thousands of incidents draws
    in about the time of a short one."""
    from matplotlib.collections import LineCollection, PolyCollection

    total = report.time.total
    across = ax.get_xaxis_transform()  # x in data, y from the bottom (0) to the top (1) of the axes
    spans: dict[str, tuple[str, list[tuple[float, float]], dict[str, Any]]] = {}

    def span(start: float, end: float, colour: str, label: str, **kwargs: Any) -> None:
        spans.setdefault(label, (colour, [], kwargs))[1].append((start / scale, end / scale))

    if report.time.startup:
        span(0.0, report.time.startup, "#bab0ac", "start-up / shut-down", hatch="//")
    if report.time.shutdown:
        span(total - report.time.shutdown, total, "#bab0ac", "start-up / shut-down", hatch="//")
    for inc in report.incidents:
        end = inc.end_t if inc.end_t is not None else total
        span(inc.start_t, end, _LAYER_COLOURS.get(inc.layer, "#ff9da7"), f"recovery: {inc.layer}")
    for label, (colour, ranges, kwargs) in spans.items():
        boxes = [[(a, 0.0), (a, 1.0), (b, 1.0), (b, 0.0)] for a, b in ranges]
        ax.add_collection(
            PolyCollection(
                boxes,
                transform=across,
                facecolors=colour,
                edgecolors=colour,  # the hatch is drawn in the edge colour
                alpha=0.18,
                linewidths=0,
                label=label if labels else None,
                **kwargs,
            ),
            autolim=False,
        )
    if not report.incidents:
        return
    faults = [[(i.start_t / scale, 0.0), (i.start_t / scale, 1.0)] for i in report.incidents]
    ax.add_collection(
        LineCollection(
            faults,
            transform=across,
            colors=_FAULT,
            linewidths=1.2,
            linestyles="--",
            label="fault" if labels else None,
        ),
        autolim=False,
    )
    if labels and len(report.incidents) <= _MAX_LABELS:
        for inc in report.incidents:
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
    """Each stretch's steps, kept in blue and rolled back in red; the jump back at each restore.
    The stretches of one kind are one line, broken between stretches."""
    from matplotlib.collections import LineCollection

    kept_line, lost_line, down = _step_lines(report, scale)
    if down:
        ax.add_collection(
            LineCollection(
                down, colors="grey", linestyles=":", linewidths=1, label="down: fault to next step"
            )
        )
    if kept_line:
        ax.plot(*_xy(kept_line), color=_KEPT, lw=2, marker=".", ms=4, label="steps kept")
    if lost_line:
        ax.plot(*_xy(lost_line), color=_LOST, lw=2, marker=".", ms=4, label="steps rolled back")
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
    if len(report.incidents) <= _MAX_LABELS:
        _label_resumes(ax, report, scale)


_Line = list[tuple[float, float]]


def _step_lines(report: Report, scale: float) -> tuple[_Line, _Line, list[_Line]]:
    """(the kept steps' line, the rolled-back steps' line, each jump from the last step before a
    fault to the first one after it), in ``scale`` units of time."""
    kept_line: _Line = []
    lost_line: _Line = []
    down: list[_Line] = []
    previous: tuple[float, int] | None = None
    for seg in report.segments:
        if not seg.points:
            continue
        kept, lost = _split_line(seg)
        if previous is not None:  # from the last step before the fault to the resumed one
            down.append([(previous[0] / scale, previous[1]), (seg.points[0][0] / scale, seg.points[0][1])])
        for line, part in ((kept_line, kept), (lost_line, lost)):
            if part:
                line.extend((t / scale, s) for t, s in part)
                line.append(_BREAK)
        previous = (seg.end_t, seg.last_step)
    return kept_line, lost_line, down


def _label_resumes(ax: Axes, report: Report, scale: float) -> None:
    """``resumed after N`` at each incident's end, where it restored a checkpoint."""
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


_BREAK = (math.nan, math.nan)
"""Between two stretches in one line: matplotlib does not join points across a NaN."""


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


def _xy(points: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    return [t for t, _ in points], [s for _, s in points]


def _draw_freshness(ax: Axes, report: Report, scale: float) -> None:
    import numpy as np

    series = sorted(report.freshness, key=lambda p: p[0])  # stable: a commit's before and after
    if not series:
        ax.text(0.5, 0.5, "no steps logged", transform=ax.transAxes, ha="center", color="grey")
        return
    times = [t for t, _, _ in series]
    line: list[tuple[float, float]] = []
    for seg in report.segments:  # one stretch of the line per stretch of training
        if seg.start_t is None:
            continue
        mine = series[bisect.bisect_left(times, seg.start_t) : bisect.bisect_right(times, seg.end_t)]
        if mine:
            line.extend((t / scale, float(n)) for t, n, _ in mine)
            line.append(_BREAK)
    if line:
        xs, ys = _xy(line)
        ax.fill_between(xs, np.ma.masked_invalid(ys), color=_KEPT, alpha=0.25, lw=0)
        ax.plot(xs, ys, color=_KEPT, lw=1.2)
    marks = [
        (i.start_t / scale, i.freshness_steps) for i in report.incidents if i.freshness_steps is not None
    ]
    if marks:
        ax.plot(*_xy([(t, float(n)) for t, n in marks]), ls="none", marker="x", color=_FAULT, ms=7, mew=2)

"""Rules against measured timings (``nvtrain validate --timings``): timeouts with a margin over
the longest legitimate gap, a stop that outlasts a checkpoint write, saves that keep up."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from nvtrain.config.checks_base import duration as _d
from nvtrain.config.checks_base import finding as _f
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding

if TYPE_CHECKING:
    from nvtrain.config.timings import Timings

__all__ = ["MARGIN", "timing_rules"]

MARGIN = 1.5
"""A timeout checked against measured timings must exceed the longest measured gap by this factor."""


def _longest_gap(t: Timings) -> tuple[float, str] | None:
    """The longest gap between two heartbeats of healthy workers, and what it is, in words: the
    longest step, or, when the loop runs an evaluation between steps, a median step and the
    longest evaluation after it, whichever is longer. None without ``step`` and ``eval``."""
    gaps: list[tuple[float, str]] = []
    if t.step is not None:
        gaps.append((t.step.worst, f"the longest measured step ({_d(t.step.worst)})"))
    if t.eval is not None:
        if t.step is None:
            gaps.append((t.eval.worst, f"the longest measured evaluation ({_d(t.eval.worst)})"))
        else:
            gap = t.step.median + t.eval.worst
            gaps.append(
                (
                    gap,
                    f"the longest measured step plus evaluation ({_d(gap)}: median step "
                    f"{_d(t.step.median)} + longest eval {_d(t.eval.worst)})",
                )
            )
    return max(gaps, key=lambda g: g[0]) if gaps else None


def timing_rules(p: Policy, t: Timings) -> Iterator[Finding]:
    """Timeouts and intervals against what a run measured (``nvtrain validate --timings``)."""
    hb = p.heartbeat
    longest = _longest_gap(t)
    if longest is not None:
        gap, what = longest
        for table, key, limit in (
            ("heartbeat", "timeout", hb.timeout),
            (
                "restart.in_process",
                "soft_timeout",
                p.restart.in_process.soft_timeout if p.restart.in_process.enabled else None,
            ),
        ):
            if limit is None:
                continue
            if limit <= gap:
                yield _f(
                    "error",
                    "timeout-measured",
                    table,
                    key,
                    limit,
                    f"is not longer than {what}: healthy workers would be taken for hung",
                    f'raise it to at least "{_d(gap * MARGIN)}"',
                )
            elif limit < gap * MARGIN:
                yield _f(
                    "warning",
                    "timeout-margin",
                    table,
                    key,
                    limit,
                    f"leaves less than {MARGIN}x margin over {what}",
                    f'raise it to at least "{_d(gap * MARGIN)}"',
                )
    startup = sum(m.worst for m in (t.restore, t.step) if m is not None)
    if t.restore is not None and hb.initial_timeout is not None and hb.initial_timeout < startup * MARGIN:
        yield _f(
            "warning",
            "timeout-margin",
            "heartbeat",
            "initial_timeout",
            hb.initial_timeout,
            f"leaves less than {MARGIN}x margin over the measured checkpoint load and first "
            f"step ({_d(startup)})",
            f'raise it to at least "{_d(startup * MARGIN)}"',
        )
    if t.save_write is not None and p.job.stop_timeout < t.save_write.worst:
        yield _f(
            "warning",
            "stop-before-write",
            "job",
            "stop_timeout",
            p.job.stop_timeout,
            f"is shorter than the longest measured checkpoint write ({_d(t.save_write.worst)}): "
            "a pod stopped during a save is killed before the checkpoint is committed (the "
            "manifests derive terminationGracePeriodSeconds from this value)",
            f'raise it to at least "{_d(t.save_write.worst * MARGIN)}"',
        )
    c = p.checkpoint
    if c.async_ and t.step is not None and t.save_write is not None:
        between = c.interval * t.step.median
        if between < t.save_write.median:
            need = math.ceil(t.save_write.median * MARGIN / t.step.median - 1e-9)
            yield _f(
                "warning",
                "write-bound",
                "checkpoint",
                "interval",
                c.interval,
                f"{c.interval} steps take about {_d(between)}, less than one background write "
                f"({_d(t.save_write.median)}): each save waits for the previous write",
                f"use interval >= {int(need)}, or faster storage",
            )

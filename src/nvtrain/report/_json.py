"""The report as JSON-ready data (``nvtrain report --json``). Times are seconds; ``*_s`` keys
and ``t_s`` (seconds since the job's first event) say so in their names.

Reads ``model``'s dataclasses; ``model`` knows nothing of this module."""

from __future__ import annotations

from typing import Any

from nvtrain.report.model import (
    INFRASTRUCTURE_GOODPUT,
    TOTAL_JOB_TIME,
    TRAINING_GOODPUT,
    Incident,
    Report,
    Stats,
)

__all__ = ["SCHEMA_VERSION", "report_dict"]

SCHEMA_VERSION = 1
"""Bumped when a key changes meaning or goes away (new keys do not bump it)."""


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _stats(stats: Stats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {
        "count": stats.count,
        "median": _r(stats.median),
        "p95": _r(stats.p95),
        "max": _r(stats.max),
        "total": _r(stats.total),
    }


def _incident(i: Incident) -> dict[str, Any]:
    return {
        "index": i.index,
        "layer": i.layer,
        "cause": i.cause,
        "fault_logged": i.fault_logged,
        "recovered": i.recovered,
        "start_t_s": _r(i.start_t),
        "end_t_s": _r(i.end_t),
        "recovery_s": _r(i.seconds),
        "phases_s": {name: _r(v) for name, v in i.phases.items()},
        "restarts": dict(i.restarts),
        "failed_attempts": i.failed_attempts,
        "last_step": i.last_step,
        "restored_step": i.restored_step,
        "restore_source": i.restore_source,
        "restore_load_s": _r(i.restore_load_s),
        "rollback_steps": i.rollback_steps,
        "rollback_s": _r(i.lost_s),
        "freshness_steps": i.freshness_steps,
        "freshness_s": _r(i.freshness_s),
    }


def report_dict(report: Report, timeline: str | None = None) -> dict[str, Any]:
    """Every figure of ``report``, and the path of its PNG ``timeline`` when one was written;
    keys are stable (``schema`` is bumped when one changes)."""
    split = report.time
    ckpt = report.checkpoints
    blocked_total = ckpt.blocked.total if ckpt.blocked else 0.0
    return {
        "schema": SCHEMA_VERSION,
        "source": report.source,
        "run_id": report.run_id,
        "start_ts": report.start_ts,
        "nodes": report.nodes,
        "ranks": report.ranks,
        "exit_code": report.exit_code,
        "definitions": {
            "total_job_time": TOTAL_JOB_TIME,
            "training_goodput": TRAINING_GOODPUT,
            "infrastructure_goodput": INFRASTRUCTURE_GOODPUT,
        },
        "goodput": {
            "training": _r(report.training_goodput),
            "infrastructure": _r(report.infrastructure_goodput),
            "training_with_replays": _r(report.training_goodput_with_replays),
        },
        "time_s": {
            "total": _r(split.total),
            "startup": _r(split.startup),
            "up": _r(split.up),
            "recovering": _r(split.recovering),
            "shutdown": _r(split.shutdown),
        },
        "steps": {
            "final": report.final_step,
            "kept": report.kept_steps,
            "executed": report.executed_steps,
            "rolled_back": report.lost_steps,
            "kept_s": _r(report.kept_s),
            "rolled_back_s": _r(report.lost_s),
            "median_step_s": _r(report.step_s),
        },
        "incidents": [_incident(i) for i in report.incidents],
        "recovery": {
            layer.layer: {
                "count": layer.total.count,
                "total_s": _stats(layer.total),
                "phases_s": {name: _stats(s) for name, s in layer.phases.items()},
            }
            for layer in report.layers
        },
        "restarts": {
            "by_layer": dict(report.restarts_by_layer),
            "by_cause": dict(report.restarts_by_cause),
            "failed_attempts": report.failed_attempts,
        },
        "rollback": {"steps": _stats(report.rollback_steps), "seconds": _stats(report.rollback_s)},
        "freshness": {
            "at_faults": {"steps": _stats(report.freshness_steps), "seconds": _stats(report.freshness_s)},
            "series": [{"t_s": _r(t), "steps": n, "seconds": _r(s)} for t, n, s in report.freshness],
        },
        "checkpoints": {
            "saves": ckpt.saves,
            "committed": ckpt.committed,
            "partial": ckpt.partial,
            "corrupt": ckpt.corrupt,
            "failed": ckpt.failed,
            "blocked_s": _stats(ckpt.blocked),
            "blocked_fraction": _r(blocked_total / split.total) if split.total > 0 else None,
            "waited_for_previous_s": _stats(ckpt.waited),
            "background_s": _stats(ckpt.background),
            "in_flight_at_faults": {
                "finished": ckpt.finished_at_faults,
                "dropped": ckpt.dropped_at_faults,
                "waited_s": _stats(ckpt.settle_waited),
            },
            "commits": [{"t_s": _r(t), "step": step} for t, step in ckpt.commits],
        },
        "segments": [
            {
                "start_t_s": _r(s.start_t),
                "end_t_s": _r(s.end_t),
                "restored_step": s.restored_step,
                "last_step": s.last_step,
                "kept_to": s.kept_to,
            }
            for s in report.segments
        ],
        "notes": list(report.notes),
        "skipped_lines": report.skipped_lines,
        "left_out": [
            {
                "file": str(gone.file),
                "run_id": gone.run_id,
                "events": gone.events,
                "lines": [[first, last] for first, last in gone.lines],
                "whole_file": gone.whole_file,
            }
            for gone in report.left_out
        ],
        "warnings": list(report.warnings),
        "timeline": timeline,
    }

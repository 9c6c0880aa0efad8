"""``nvtrain report``: goodput, recoveries, rollbacks and checkpoints of a run, from its events log.

``model`` computes (pure: what ``nvtrain.runlog.RunLog`` works out from the typed events in,
dataclasses out), ``report_dict`` turns a report into JSON data, ``timeline`` draws the PNG
(matplotlib, the ``report`` extra, imported only when drawing), ``read_report`` reads a run
directory (every pod's events log) or one log file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from nvtrain.report._json import report_dict
from nvtrain.report.model import (
    INFRASTRUCTURE_GOODPUT,
    PHASES,
    TOTAL_JOB_TIME,
    TRAINING_GOODPUT,
    Checkpoints,
    Incident,
    LayerRecovery,
    Report,
    Segment,
    Stats,
    TimeSplit,
    build_report,
)
from nvtrain.report.timeline import TIMELINE_FILE, can_draw, write_timeline
from nvtrain.runlog import RunLog, read_log

__all__ = [
    "INFRASTRUCTURE_GOODPUT",
    "PHASES",
    "TIMELINE_FILE",
    "TOTAL_JOB_TIME",
    "TRAINING_GOODPUT",
    "Checkpoints",
    "can_draw",
    "Incident",
    "LayerRecovery",
    "Report",
    "Segment",
    "Stats",
    "TimeSplit",
    "build_report",
    "read_report",
    "report_dict",
    "write_timeline",
]


def read_report(path: Path) -> Report:
    """The report of the events log at ``path`` (a run directory, whose pods' logs are merged,
    or one log file); ``UsageError`` (exit 2) naming the file when it is missing, unreadable or
    holds no valid event. Lines that are not valid events are skipped and counted
    (``Report.skipped_lines``); events of another run are left out (``Report.left_out``, and a
    line each in ``Report.warnings``)."""
    target, events = read_log(path, "RUN_DIR")
    report = build_report(RunLog(events), str(target))
    return dataclasses.replace(report, left_out=tuple(events.left_out), warnings=tuple(events.warnings()))

"""Where ``--timings PATH`` takes its timings from: a timings file or a run's events log.

``validate --timings`` and ``validate --manifest`` read them here and hand the result to
``nvtrain.config.validation``, which knows nothing about events logs.
"""

from __future__ import annotations

from pathlib import Path

from nvtrain.config.timings import Timings, read_timings
from nvtrain.errors import UsageError
from nvtrain.findings import Finding
from nvtrain.runlog import RunLog, read_log
from nvtrain.tuning.measured import measure_events

__all__ = ["read_timings_or_log"]


def read_timings_or_log(path: Path) -> tuple[Timings | None, list[Finding]]:
    """The timings that ``--timings PATH`` names, and the findings of reading them; never raises.

    PATH is a timings file (TOML, or JSON when it ends in ``.json``), or a run's events log: a
    run directory (``<checkpoint dir>/<run id>``, every pod's events log is read) or a ``.jsonl``
    file, from which the timings are measured as ``nvtrain tune-interval --from-run`` does.
    """
    if not (path.is_dir() or path.suffix == ".jsonl"):
        parsed = read_timings(path)
        return parsed.model, parsed.findings

    try:
        target, events = read_log(path, "--timings")
    except UsageError as exc:
        rule = exc.message.removeprefix(f"--timings: {path} ").removeprefix("--timings: ")
        return None, [Finding("error", "unreadable", "", None, rule, exc.fix or "", file=str(path))]
    timings = measure_events(RunLog(events), str(target)).timings
    if timings.step is not None:
        return timings, []
    no_steps = Finding(
        "warning",
        "timings-no-steps",
        "",
        None,
        "has no step timings (`step` events with a `step_s`), so the heartbeat and soft timeouts "
        "were not checked against it",
        "give the events log of a run that completed steps, or a timings file with `step`",
        file=str(target),
    )
    return timings, [no_steps]

"""Where ``--timings PATH`` takes its timings from: a timings file or a run's events log.

``validate --timings`` and ``validate --manifest`` read them here and hand the result to
``nvtrain.config.validation``, which knows nothing about events logs.
"""

from __future__ import annotations

from pathlib import Path

from nvtrain.config.timings import Timings, read_timings
from nvtrain.events import read_events
from nvtrain.findings import Finding
from nvtrain.tuning.measured import EVENTS_FILE, measure_events

__all__ = ["read_timings_or_log"]


def read_timings_or_log(path: Path) -> tuple[Timings | None, list[Finding]]:
    """The timings that ``--timings PATH`` names, and the findings of reading them; never raises.

    PATH is a timings file (TOML, or JSON when it ends in ``.json``), or a run's events log: a
    run directory (``<checkpoint dir>/<run id>``, its ``events.jsonl`` is read) or a ``.jsonl``
    file, from which the timings are measured as ``nvtrain tune-interval --from-run`` does.
    """
    if not (path.is_dir() or path.suffix == ".jsonl"):
        parsed = read_timings(path)
        return parsed.model, parsed.findings

    target = path / EVENTS_FILE if path.is_dir() else path
    fix = (
        f"give a run directory (<checkpoint dir>/<run id>) or the {EVENTS_FILE} that "
        "`nvtrain run` wrote in it"
    )
    try:
        events = read_events(target)
    except FileNotFoundError:
        rule = f"has no {EVENTS_FILE}" if path.is_dir() else "file not found"
        return None, [Finding("error", "unreadable", "", None, rule, fix, file=str(path))]
    except OSError as exc:
        rule = f"cannot be read ({exc.strerror or exc})"
        return None, [Finding("error", "unreadable", "", None, rule, fix, file=str(target))]
    if not events:
        return None, [Finding("error", "unreadable", "", None, "holds no events", fix, file=str(target))]
    timings = measure_events(events, str(target)).timings
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

"""The job's figures kept up to date from an events log that grows while the job runs.

``LiveFigures.update`` reads what was appended (every pod's log, ``nvtrain.runlog.RunTail``) and
rebuilds the report as ``nvtrain report`` builds it; a scrape takes the newest build at once
(``served``), its counters and histograms held at the highest value each series had.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from nvtrain.events.records import Event
from nvtrain.live.figures import Family, Sample, figures, initial_counters
from nvtrain.report.model import Report, build_report
from nvtrain.runlog import RunLog, RunTail

__all__ = ["BUILD_SHARE", "LiveFigures"]

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

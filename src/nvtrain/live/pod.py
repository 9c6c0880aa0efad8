"""The pod-level live figures: what one pod's own events log says about that pod.

The job's figures (goodput, incidents, restarts, checkpoints: ``nvtrain.live.figures``)
are worked out from every pod's log, and served once per job, by the pod of node rank 0
(``JOB_VIEW_RANK``). Every pod, that one included, serves the few figures of its own below,
labelled with its ``node_rank``: a handful of series per pod, whatever the job's size, read
from its own log only (``events-node<N>.jsonl``) as it grows, without building a report.
"""

from __future__ import annotations

import threading
from pathlib import Path

from nvtrain.events.records import LauncherStart, Step, WorkerFailed
from nvtrain.runlog import RunTail

__all__ = ["JOB_VIEW_RANK", "POD_FAMILIES", "PodFigures"]

JOB_VIEW_RANK = 0
"""The node rank whose pod serves the job's figures: node 0, which every job has, and whose
replacement (same completion index) takes its place."""

POD_FAMILIES: dict[str, tuple[str, str]] = {
    "pod_launcher_starts": (
        "counter",
        "Launcher starts in this pod's log: 1, and 1 more for each time Kubernetes replaced the pod.",
    ),
    "pod_worker_failures": (
        "counter",
        "Workers of this pod that ft_launcher saw exit with an error (a worker told to stop is not counted).",
    ),
    "pod_step": ("gauge", "The step this pod's workers logged last."),
    "pod_last_step_timestamp_seconds": (
        "gauge",
        "Unix time of the step this pod's workers logged last.",
    ),
    "pod_last_event_timestamp_seconds": ("gauge", "Unix time of the newest event in this pod's log."),
}
"""Every pod-level family (name without ``nvtrain_`` and, for counters, ``_total``): kind, help."""


class PodFigures:
    """The figures of one pod's events log, kept up to date by ``update`` (one at a time); a
    counter is there from the first scrape, at 0, and a gauge once its first event is read."""

    def __init__(self, log: Path) -> None:
        self._tail = RunTail(log)
        self._lock = threading.Lock()
        self._counts = {"pod_launcher_starts": 0, "pod_worker_failures": 0}
        self._gauges: dict[str, float] = {}

    def update(self) -> bool:
        """Read what the log gained; whether it gained anything."""
        new = self._tail.poll()
        if not new:
            return False
        with self._lock:
            for event in new:
                if isinstance(event, LauncherStart):
                    self._counts["pod_launcher_starts"] += 1
                elif isinstance(event, WorkerFailed):
                    self._counts["pod_worker_failures"] += 1
                elif isinstance(event, Step) and event.step is not None:
                    newest = self._gauges.get("pod_last_step_timestamp_seconds")
                    if newest is None or event.ts >= newest:
                        self._gauges["pod_step"] = float(event.step)
                        self._gauges["pod_last_step_timestamp_seconds"] = event.ts
                last = self._gauges.get("pod_last_event_timestamp_seconds", event.ts)
                self._gauges["pod_last_event_timestamp_seconds"] = max(last, event.ts)
        return True

    def values(self) -> list[tuple[str, str, str, float]]:
        """(full name, kind, help, value) of each figure known now."""
        with self._lock:
            known = {**{k: float(v) for k, v in self._counts.items()}, **self._gauges}
        return [
            (f"nvtrain_{name}", kind, text, known[name])
            for name, (kind, text) in POD_FAMILIES.items()
            if name in known
        ]

"""Live figures of a running job for Prometheus: what ``nvtrain report`` shows, while it runs.

A long-running server inside ``nvtrain run``, apart from the offline ``report`` package whose
model it serves: ``figures`` (a ``Report`` as metric families, pure), ``follow``
(``LiveFigures``: the figures of a growing events log), ``pod`` (every pod's own figures),
``errors`` (failed updates: counted, and logged once each), ``server`` (``serve``: the HTTP
endpoint and the thread that keeps it fresh; ``bind_address``), ``guarded`` (its HTTP server,
which no client can hold: a deadline for each request, a bound on connections).

Job-level series once per job, pod-level ones per pod: the pod of node rank 0
(``pod.JOB_VIEW_RANK``) serves the whole job's figures, read from every pod's events log in the
run directory (``nvtrain.runlog.RunTail``); every pod serves ``nvtrain_run_info``, the figures
of its own log (``nvtrain.live.pod``, label ``node_rank``) and ``nvtrain_metrics_errors_total``.
Every sample is labelled with the run id: ``max by (run_id)`` keeps one series of a run when a
replaced pod 0 and its predecessor overlap.

The contract (docs/report.md, "Metrics contract"): counters and histograms only go up. They
count what no longer changes: an incident (with its restarts and rollback) once it has ended, a
save's blocked time once the save has ended; and each series is served at the highest value it
had (``LiveFigures.served``). Counters exist from the first scrape, at 0 for every value of
their labels, which come from fixed sets; the labels of one counter partition what it counts,
so a sum over them counts each thing once (``initial_counters``: before the first build too).
Points in time are served as unix times (``*_timestamp_seconds``), the Prometheus way, so that
``time() - x`` is right even when the series is stale. Distributions are histograms
(``SECONDS_BUCKETS``, ``STEPS_BUCKETS``), which add up across runs and over time.
"""

from __future__ import annotations

from nvtrain.live.figures import (
    LAYERS,
    SECONDS_BUCKETS,
    STEPS_BUCKETS,
    Family,
    Sample,
    figures,
    initial_counters,
)
from nvtrain.live.follow import BUILD_SHARE, LiveFigures
from nvtrain.live.server import MetricsServer, bind_address, own_log, serve

__all__ = [
    "BUILD_SHARE",
    "LAYERS",
    "SECONDS_BUCKETS",
    "STEPS_BUCKETS",
    "Family",
    "LiveFigures",
    "MetricsServer",
    "Sample",
    "bind_address",
    "figures",
    "initial_counters",
    "own_log",
    "serve",
]

"""What `[metrics]` costs as the events log grows: rebuild time, scrape latency, memory.

The figures are rebuilt from the whole events log (in a thread of the launcher, when the log grew),
so a rebuild's cost grows with the log. This writes synthetic logs shaped like a long job (16 ranks,
a step event per rank every 10 steps, a checkpoint every 200 steps, an in-job restart every 5,000
steps) and measures, per log: the first build (read the whole log and build), a rebuild after one
more line (median of --repeat), the peak RSS growth of keeping the events, and the latency of a
real HTTP scrape of `nvtrain.live.serve` once its first build is served (median).

    python benchmarks/metrics_scrape.py --steps 10000,50000,200000
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from _lib.procs import free_port

from nvtrain.config.schema import Metrics
from nvtrain.live import LiveFigures, serve

RANKS = 16
STEP_S = 0.5


def synthetic_log(path: Path, steps: int) -> int:
    """Write a log of ``steps`` training steps; returns the number of events."""
    t, n = 1_800_000_000.0, 0
    common = {"run_id": "bench", "source": "worker", "host": "h"}

    def emit(out: Any, event: str, **fields: Any) -> None:
        nonlocal n
        out.write(json.dumps({"ts": round(t, 6), "event": event, **common, **fields}) + "\n")
        n += 1

    with path.open("w", encoding="utf-8") as out:
        emit(out, "launcher_start", node=0, source="launcher")
        attempt, step = 0, 0
        while step < steps:
            step += 10
            t += 10 * STEP_S
            for rank in range(RANKS):
                emit(out, "step", rank=rank, pid=1000 * attempt + rank, step=step, step_s=STEP_S, attempt=0)
            if step % 200 == 0:
                for rank in range(RANKS):
                    pid = 1000 * attempt + rank
                    emit(out, "checkpoint_begin", rank=rank, pid=pid, step=step, waited_for_previous_s=0.0)
                    emit(out, "checkpoint_staged", rank=rank, pid=pid, step=step, blocked_s=0.2)
                    emit(out, "checkpoint_committed", rank=rank, pid=pid, step=step, write_s=5.0)
            if step % 5000 == 0 and step < steps:
                emit(
                    out,
                    "worker_failed",
                    node=0,
                    source="launcher",
                    local_rank=3,
                    exit_code=-9,
                    signal="SIGKILL",
                )
                t += 2
                emit(out, "restart_begin", node=0, source="launcher", layer="in_job")
                t += 20
                attempt += 1
                step -= step % 200  # back to the newest checkpoint
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="10000,50000,200000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for steps in map(int, args.steps.split(",")):
            path = Path(tmp) / f"events-{steps}.jsonl"
            events = synthetic_log(path, steps)
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            live = LiveFigures(path, refresh=0.001)
            start = time.perf_counter()
            live.update()
            first = time.perf_counter() - start
            rebuilds = []
            for i in range(args.repeat):  # the log grew by one line, as in a running job
                with path.open("a", encoding="utf-8") as out:
                    out.write(json.dumps({"ts": 1_900_000_000.0 + i, "event": "heartbeat"}) + "\n")
                start = time.perf_counter()
                live.update()
                rebuilds.append(time.perf_counter() - start)
            rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
            del live
            server = serve(Metrics(enabled=True, port=free_port()), path, run_id="bench", node_rank=0)
            scrapes = []
            try:
                url = f"http://127.0.0.1:{server.port}/metrics"
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline:  # until the first build is served
                    with urllib.request.urlopen(url, timeout=60) as reply:
                        if b"nvtrain_step" in reply.read():
                            break
                    time.sleep(0.1)
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    with urllib.request.urlopen(url, timeout=60) as reply:
                        reply.read()
                    scrapes.append(time.perf_counter() - start)
            finally:
                server.close()
            rows.append(
                (
                    steps,
                    events,
                    path.stat().st_size / 2**20,
                    first,
                    statistics.median(rebuilds),
                    statistics.median(scrapes),
                    rss,
                )
            )
    print(
        "| steps | events | log (MiB) | first build (s) | rebuild, median (s) | scrape, median (ms) "
        "| peak RSS growth (MiB) |"
    )
    print("|---|---|---|---|---|---|---|")
    for steps, events, mib, first, rebuild, scrape, rss in rows:
        print(
            f"| {steps:,} | {events:,} | {mib:.1f} | {first:.3f} | {rebuild:.3f} | {scrape * 1000:.1f} "
            f"| {rss:.0f} |"
        )


if __name__ == "__main__":
    main()

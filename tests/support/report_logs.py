"""Events logs for the report tests: hand-built ones with round numbers, and the real ones."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from nvtrain.events.records import Event, from_fields

ROOT = Path(__file__).resolve().parents[2]
CPU_LOG = ROOT / "tests/tuning/data/cpu-demo-events.jsonl"  # `nvtrain run` demo: exception@50, SIGKILL@90
GPU_LOG = ROOT / "benchmarks/checkpoint/results/h200-gpu-demo-events.jsonl"
MEM_TRUE_LOG = ROOT / "benchmarks/checkpoint/results/h200-in-memory-true-events.jsonl"
MEM_FALSE_LOG = ROOT / "benchmarks/checkpoint/results/h200-in-memory-false-events.jsonl"
V0_LOG = ROOT / "tests/report/data/events-v0.jsonl"
"""`nvtrain run` before versioned events (no `v`): 2 ranks, an exception at step 25 (in-process,
back to 20), a SIGKILL at step 45 (in-job, back to 40); 60 steps."""
REAL_LOGS = (CPU_LOG, GPU_LOG, MEM_TRUE_LOG, MEM_FALSE_LOG, V0_LOG)


def typed(events: Iterable[dict[str, Any]]) -> list[Event]:
    """Hand-built events as ``read_events`` gives them: typed records (each one must be valid)."""
    records = []
    for fields in events:
        record = from_fields(fields)
        assert record is not None, f"not a valid event: {fields}"
        records.append(record)
    return records


class Log:
    """Events at given times (seconds), written the way the launcher and the workers write them."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def at(self, t: float, event: str, **fields: Any) -> Log:
        self.events.append({"ts": 1000.0 + t, "event": event, "run_id": "r", **fields})
        return self

    def step(self, t: float, step: int, *, first: bool = False, pid: int = 1, attempt: int = 0) -> Log:
        return self.at(
            t, "step", step=step, step_s=None if first else 1.0, pid=pid, attempt=attempt, rank=pid - 1
        )

    def save(self, t: float, step: int, *, blocked: float = 0.5, pid: int = 1) -> Log:
        self.at(t, "checkpoint_begin", step=step, pid=pid, waited_for_previous_s=0.0)
        return self.at(
            t + blocked, "checkpoint_staged", step=step, pid=pid, blocked_s=blocked, **{"async": True}
        )

    def records(self) -> list[Event]:
        """The events as typed records, in the order they were added."""
        return typed(self.events)

    def write(self, path: Path) -> Path:
        path.write_text("".join(json.dumps(e) + "\n" for e in self.events), encoding="utf-8")
        return path


def first_stretch(log: Log) -> Log:
    """Start-up, then steps 1..25 at 1 s a step with saves at 10 and 20 (0.5 s blocked each)."""
    log.at(0, "launcher_start", node=0, source="launcher")
    log.at(1, "rendezvous_done", node=0, round=0)
    log.at(2, "worker_start", pid=1, rank=0, restart_count=0)
    log.at(3, "attempt_start", pid=1, rank=0, world=1, iteration=0, restart_count=0)
    log.step(4, 1, first=True).step(13, 10).save(13, 10)
    log.at(15, "checkpoint_committed", step=10, pid=1, write_s=1.5)
    log.step(23.5, 20).save(23.5, 20)
    return log.at(26, "checkpoint_committed", step=20, pid=1, write_s=2.0)


def two_recoveries() -> Log:
    """An exception at step 25 (in-process, back to 20), a SIGKILL at step 45 (in-job, back to 40).

    Every step takes 1 s and every save blocks 0.5 s, so: 60 kept steps = 60 s of 100 s, 10 steps
    rolled back (10 s); up 25 + 25 + 22 s; recoveries 4 s and 13 s; start-up 4 s, shut-down 7 s.
    """
    log = first_stretch(Log())
    log.at(29, "fault_injected", step=25, pid=1, rank=0, kind="exception")
    log.at(30, "restart_begin", layer="in_process", pid=1, rank=0, iteration=0)
    log.at(31, "restart_end", layer="in_process", pid=1, rank=0, iteration=1)
    log.at(31.5, "attempt_start", pid=1, rank=0, world=1, iteration=1, restart_count=0)
    log.at(32, "checkpoint_restored", step=20, pid=1, source="memory", seconds=0.5)
    log.step(33, 21, first=True, attempt=1).step(42, 30, attempt=1).save(42, 30)
    log.at(44, "checkpoint_committed", step=30, pid=1, write_s=1.5)
    log.step(52.5, 40, attempt=1).save(52.5, 40)
    log.at(55, "checkpoint_committed", step=40, pid=1, write_s=2.0)
    log.at(58, "fault_injected", step=45, pid=1, rank=0, kind="sigkill")
    log.at(58.5, "worker_failed", node=0, local_rank=0, exit_code=-9, signal="SIGKILL", step=40)
    log.at(59, "restart_begin", layer="in_job", node=0, attempts_left=3, max_restarts=3)
    log.at(60, "rendezvous_done", node=0, round=1)
    log.at(65, "worker_start", pid=2, rank=0, restart_count=1)
    log.at(66, "attempt_start", pid=2, rank=0, world=1, iteration=0, restart_count=1)
    log.at(70, "checkpoint_restored", step=40, pid=2, source="storage", seconds=2.0)
    log.step(71, 41, first=True, pid=2).step(80, 50, pid=2).save(80, 50, pid=2)
    log.at(83, "checkpoint_committed", step=50, pid=2, write_s=2.5)
    log.step(90.5, 60, pid=2).save(90.5, 60, pid=2)
    log.at(93, "checkpoint_committed", step=60, pid=2, write_s=2.0)
    return log.at(100, "launcher_exit", node=0, exit_code=0, cause="finished")


def lost_pod(origins: Sequence[str | None]) -> Log:
    """``two_recoveries``, but the SIGKILL's in-job restart replaced a pod: the new ranks
    (``origins``, rank 0 first; None: the load does not say where it read from) each load step 40
    at 70 s, in 2 s."""
    log = two_recoveries()
    k = next(i for i, e in enumerate(log.events) if e["event"] == "checkpoint_restored" and e["pid"] == 2)
    loads = Log()
    for rank, origin in enumerate(origins):
        where = {} if origin is None else {"origin": origin}
        loads.at(70, "checkpoint_restored", step=40, pid=2 + rank, rank=rank, seconds=2.0, **where)
    log.events[k : k + 1] = loads.events
    return log

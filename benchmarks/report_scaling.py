"""How `nvtrain report` scales with the events log: wall time and peak memory per log size.

Writes synthetic restart-heavy logs (8 ranks, a step event per rank every 10 steps, a save every
10 steps, a fault about every 40 steps: in-process restarts, in-job restarts, hangs with a failed
attempt, corrupt checkpoints, relaunches and pod restarts in turn) of the given sizes in a
temporary directory, then runs `nvtrain report LOG --json --no-timeline` and `nvtrain report LOG
--json` (which also draws the PNG timeline) on each as a child process, and reports their wall
time, CPU time and peak RSS (the child's `ru_maxrss` and `ru_utime + ru_stime`, from `os.wait4`).
Each report is stopped after --timeout seconds, and none starts once --budget seconds have gone
(its row says so), so the script always ends.

    python benchmarks/report_scaling.py                  # 2, 10, 50, 200 MB
    python benchmarks/report_scaling.py --sizes 2,5,10,20 --timeout 120 --budget 300

To measure another version of nvtrain, point PYTHONPATH at its `src` (the children inherit it).

`synthetic_log` is also used by tests/report/test_hostile_events.py.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

RANKS = 8
STEP_S = 0.5
CYCLE = 40
"""Steps between two faults."""
SAVE_EVERY = 10


class _Writer:
    """Writes events the way `EventLog` does (compact JSON, the writer's common fields)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.t = 1_800_000_000.0
        self.events = 0

    def emit(self, event: str, common: dict[str, Any], **fields: Any) -> None:
        record = {"ts": round(self.t, 6), "event": event, **common, **fields}
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.events += 1


def synthetic_log(path: Path, size: int, *, ranks: int = RANKS, cycle_steps: int = CYCLE) -> int:
    """Write a restart-heavy log of about ``size`` bytes (at least one fault cycle) to ``path``:
    ``ranks`` ranks, a fault every ``cycle_steps`` steps or so; returns the number of events."""
    with path.open("w", encoding="utf-8") as out:
        w = _Writer(out)
        launcher = {"host": "node0", "pid": 900, "node": 0, "run_id": "bench", "source": "launcher"}
        w.emit("launcher_start", launcher, argv=["ft_launcher", "--nproc-per-node=8"], is_host=True)
        w.emit("rendezvous_done", launcher, round=0, group_rank=0, nodes=1)
        pids = [1000 + r for r in range(ranks)]
        restart_count, iteration, rdzv, cycle, resumed = 0, 0, 1, 0, 0

        def worker(rank: int) -> dict[str, Any]:
            return {"host": "node0", "pid": pids[rank], "run_id": "bench", "source": "worker", "rank": rank}

        def start_attempt(restored: int | None, origin: str) -> None:
            for r in range(ranks):
                w.emit(
                    "attempt_start", worker(r), world=ranks, iteration=iteration, restart_count=restart_count
                )
            w.t += 1.0
            if restored is not None:
                for r in range(ranks):
                    w.emit("checkpoint_restored", worker(r), step=restored, origin=origin, seconds=0.8)
            w.t += 0.5

        for r in range(ranks):
            w.emit("worker_start", worker(r), restart_count=0)
        start_attempt(None, "storage")
        while True:
            # One stretch of training: the first step, every 10th, a save every SAVE_EVERY steps.
            step = resumed
            last = resumed + cycle_steps - cycle % 7
            first = True
            while step < last:
                step += 1
                w.t += STEP_S
                if first or step % 10 == 0:
                    for r in range(ranks):
                        w.emit(
                            "step",
                            worker(r),
                            step=step,
                            step_s=None if first else STEP_S,
                            attempt=iteration,
                            restart_count=restart_count,
                            loss=0.25,
                        )
                    first = False
                if step % SAVE_EVERY == 0:
                    for r in range(ranks):
                        w.emit("checkpoint_begin", worker(r), step=step, waited_for_previous_s=0.0)
                    w.t += 0.2
                    for r in range(ranks):
                        w.emit(
                            "checkpoint_staged",
                            worker(r),
                            step=step,
                            blocked_s=0.2,
                            stage_s=0.15,
                            **{"async": True},
                        )
                    w.t += 1.5
                    for r in range(ranks):
                        w.emit("checkpoint_committed", worker(r), step=step, write_s=1.5, bytes=1 << 30)
            saved = step - step % SAVE_EVERY
            if out.tell() >= size:
                break
            w.t += 0.3
            kind = cycle % 5
            w.emit(
                "fault_injected",
                worker(cycle % ranks),
                step=step,
                kind="exception" if kind == 0 else "sigkill",
            )
            w.t += 0.5
            if kind in (0, 3):  # in-process restart, from host memory (kind 3: a corrupt save first)
                for r in range(ranks):
                    w.emit("restart_begin", worker(r), layer="in_process", iteration=iteration)
                w.t += 2.0
                iteration += 1
                for r in range(ranks):
                    w.emit("restart_end", worker(r), layer="in_process", iteration=iteration)
                if kind == 3 and saved > SAVE_EVERY:
                    for r in range(ranks):
                        w.emit(
                            "checkpoint_corrupt",
                            worker(r),
                            step=saved,
                            path=f"/ckpt/bench/step-{saved}",
                            problem="checksum",
                        )
                    saved -= SAVE_EVERY
                start_attempt(saved, "memory" if kind == 0 else "storage")
            else:  # in-job restart; kind 2: a hang, and the first new attempt fails as well
                if kind == 2:
                    w.emit("hang_detected", launcher, local_rank=cycle % ranks, heartbeat="missed")
                attempts = 2 if kind == 2 else 1
                for attempt in range(attempts):
                    w.emit(
                        "worker_failed",
                        launcher,
                        local_rank=cycle % ranks,
                        worker_pid=pids[cycle % ranks],
                        exit_code=-9 if attempt == 0 else 1,
                        signal="SIGKILL" if attempt == 0 else None,
                        step=step,
                    )
                    w.t += 0.2
                    if cycle % 50 == 4 and attempt == 0:  # the launcher was lost: started again
                        w.emit("relaunch", launcher, layer="launcher", reason="lost", attempt=cycle)
                    elif cycle % 50 == 9 and attempt == 0:  # the pod was restarted
                        w.emit("launcher_start", launcher, argv=["ft_launcher"], is_host=True)
                    else:
                        w.emit(
                            "restart_begin",
                            launcher,
                            layer="in_job",
                            attempts_left=1000 - rdzv,
                            max_restarts=1000,
                        )
                    w.t += 1.0
                    w.emit("rendezvous_done", launcher, round=rdzv, group_rank=0, nodes=1)
                    rdzv += 1
                    restart_count += 1
                    iteration = 0
                    pids = [p + ranks for p in pids]
                    w.t += 3.0
                    for r in range(ranks):
                        w.emit("worker_start", worker(r), restart_count=restart_count)
                    start_attempt(saved, "storage")
            resumed = saved
            cycle += 1
        w.t += 2.0
        w.emit("launcher_exit", launcher, exit_code=0, cause="finished")
        return w.events


@dataclasses.dataclass
class Run:
    """One report: wall seconds, the child's peak RSS (MiB), CPU seconds (user + system), its
    exit code (None: stopped at the timeout, or not run for want of budget) and stdout."""

    wall: float
    rss: float
    cpu: float
    code: int | None
    limit: float
    out: bytes = b""

    def cell(self) -> str:
        if self.code is None:
            return "skipped (budget)" if self.limit <= 0 else f"> {self.limit:.3g} (stopped)"
        return f"{self.wall:.2f}" if self.code == 0 else f"exit {self.code}"


def run_report(command: list[str], timeout: float) -> Run:
    """Run ``command`` as a child; SIGKILL it after ``timeout`` seconds."""
    if timeout <= 0:
        return Run(0.0, 0.0, 0.0, None, timeout)
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE)
        deadline = start + timeout
        code: int | None = None
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() > deadline:
                child.send_signal(signal.SIGKILL)
                _, _, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - start
        child.returncode = -9 if code is None else code  # reaped here: Popen must not wait again
        assert child.stderr is not None
        errors = child.stderr.read().decode(errors="replace")
        child.stderr.close()
        if code not in (0, None):
            sys.stderr.write(errors[-2000:])
        out.seek(0)
        return Run(wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, code, timeout, out.read())


def _machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (
        f"{when}, {platform.node()}: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", default="2,10,50,200", help="log sizes in MB (10^6 bytes), comma-separated"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per report before it is stopped"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=480.0,
        help="seconds for the whole benchmark: later reports are skipped",
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs nvtrain")
    args = parser.parse_args()
    end = time.monotonic() + args.budget
    print(f"# {_machine()}")
    print(
        "| log (MB) | events | incidents | `--json --no-timeline` (s) | CPU (s) | µs / event (with start-up) "
        "| peak RSS (MiB) | `--json` with the PNG (s) | peak RSS (MiB) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for mb in (float(s) for s in args.sizes.split(",")):
            path = Path(tmp) / f"events-{mb:g}MB.jsonl"
            events = synthetic_log(path, int(mb * 1_000_000))
            command = [args.python, "-m", "nvtrain", "report", str(path), "--json"]
            plain = run_report([*command, "--no-timeline"], min(args.timeout, end - time.monotonic()))
            drawn = run_report(command, min(args.timeout, end - time.monotonic()))
            incidents = len(json.loads(plain.out)["incidents"]) if plain.code == 0 else "?"
            per_event = f"{plain.wall / events * 1e6:.1f}" if plain.code == 0 else "–"
            print(
                f"| {path.stat().st_size / 1e6:.1f} | {events:,} | {incidents} | {plain.cell()} "
                f"| {plain.cpu:.2f} | {per_event} | {plain.rss:.0f} "
                f"| {drawn.cell()} | {drawn.rss:.0f} |",
                flush=True,
            )
            path.unlink()
    print(f"# done: load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

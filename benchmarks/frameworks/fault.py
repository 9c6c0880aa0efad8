"""The fault and the clock of the framework scripts: each prints ``BENCH STEP <n> <unix time>``
on global rank 0 after every step, and ``BENCH FAULT <n> <unix time>`` just before rank 0
SIGKILLs itself at step ``BENCH_FAULT_STEP`` (once per run: a marker file ``BENCH_FAULT_MARK``
says it happened). No nvtrain import: these are the scripts a torchrun user brings."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def main_started() -> None:
    """At the top of the script's ``main()``: ``BENCH MAIN <unix time>`` (rank 0), so that a
    recovery splits into the launcher's part (fault to a new process running the script) and the
    script's own (its set-up and checkpoint load, to the first step)."""
    if rank() == 0:
        print(f"BENCH MAIN 0 {time.time():.6f}", flush=True)


def step_done(step: int) -> None:
    """After step ``step``: print it (rank 0), and kill rank 0 at the fault step once."""
    if rank() != 0:
        return
    print(f"BENCH STEP {step} {time.time():.6f}", flush=True)
    fault = int(os.environ.get("BENCH_FAULT_STEP", "0") or 0)
    mark = Path(os.environ.get("BENCH_FAULT_MARK", "/nonexistent/mark"))
    if fault and step == fault and mark.parent.is_dir() and not mark.exists():
        mark.write_text("fired\n", encoding="utf-8")
        print(f"BENCH FAULT {step} {time.time():.6f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

"""Rank ``--fail-rank`` exits with ``--code`` on every attempt; the other ranks wait to be stopped.

With ``--step-event N`` the failing rank first reports step N in the run's events log
(``NVTRAIN_EVENTS``), as the worker library does after each step, so the supervisor can tell
that the failures repeat at the same step. With ``--after S`` it works (sleeps) S seconds before
failing; with ``--fail-until R`` attempts from restart R on finish at once instead (exit 0 on
every rank). No torch import, so each attempt starts fast.
Markers: ``WORKER START``, ``WORKER FAIL``, ``WORKER DONE``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def report_step(step: int, rank: int) -> None:
    record = {"ts": time.time(), "event": "step", "step": step, "rank": rank, "source": "worker"}
    fd = os.open(os.environ["NVTRAIN_EVENTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--code", type=int, default=3)
    parser.add_argument("--step-event", type=int, default=None)
    parser.add_argument("--after", type=float, default=0.0)
    parser.add_argument("--fail-until", type=int, default=None)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"WORKER START rank={rank} restart={restart} pid={os.getpid()}", flush=True)
    if args.fail_until is not None and int(restart) >= args.fail_until:
        print(f"WORKER DONE rank={rank} restart={restart}", flush=True)
        return
    if rank == args.fail_rank:
        time.sleep(args.after)
        if args.step_event is not None:
            report_step(args.step_event, rank)
        print(f"WORKER FAIL rank={rank} restart={restart} code={args.code}", flush=True)
        sys.exit(args.code)
    time.sleep(60)


if __name__ == "__main__":
    main()

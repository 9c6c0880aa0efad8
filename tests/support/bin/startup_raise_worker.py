"""Rank ``--fail-rank`` raises ``ValueError`` at start-up, before any step or collective (a typo
in a script); the other ranks wait to be stopped. ``--vary``: the message names the attempt, so
no two failures are the same. No torch import, so each attempt starts fast.
Markers: ``WORKER START rank=R restart=C pid=P``.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--vary", action="store_true")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"WORKER START rank={rank} restart={restart} pid={os.getpid()}", flush=True)
    if rank == args.fail_rank:
        detail = f" (attempt {restart})" if args.vary else ""
        raise ValueError(f"unknown option 'lr_shedule'{detail}")
    time.sleep(60)


if __name__ == "__main__":
    main()

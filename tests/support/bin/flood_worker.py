"""A worker whose second attempt writes far more output than a pipe holds, at a time the test
chooses. Synchronised on files in ``--sync DIR`` (the test creates ``go`` and ``freed``).

Attempt 0: every rank says ``WORKER START`` and waits for ``DIR/go``; then rank 1 exits 3 (so
ft_launcher restarts the workers and nvtrain has events to record) and the others wait to be
stopped. Attempt 1: every rank prints ``--lines`` lines ``WORKER LINE rank=R n=N`` and
``WORKER FLOODED``, waits for ``DIR/freed``, says ``WORKER DONE`` and exits 0. No torch import.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sync", type=Path, required=True)
    parser.add_argument("--lines", type=int, default=2000)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"WORKER START rank={rank} restart={restart} pid={os.getpid()}", flush=True)
    if restart == "0":
        wait_for(args.sync / "go")
        if rank == 1:
            print(f"WORKER FAIL rank={rank} restart={restart}", flush=True)
            sys.exit(3)
        time.sleep(60)
        return
    pad = "x" * 80
    for n in range(args.lines):
        print(f"WORKER LINE rank={rank} n={n} {pad}", flush=True)
    print(f"WORKER FLOODED rank={rank}", flush=True)
    wait_for(args.sync / "freed")
    print(f"WORKER DONE rank={rank} restart={restart}", flush=True)


if __name__ == "__main__":
    main()

"""A worker of nvtrain's worker library that holds its process group open until told to end.

``store_bind_worker.py DIR``: under ``nvw.run`` (``env://`` or in-process restart, as the policy
says), writes ``DIR/ready-<rank>`` (JSON: its pid, ``MASTER_ADDR``, ``MASTER_PORT``) once its
process group is up, then waits (in a section: not a hang) until ``DIR/go`` exists (at most
120 s: exit 1 with ``NO GO``), meets the other ranks once more and returns. Marker:
``STORE BIND DONE rank=<rank>``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import nvtrain.worker as nw


def main(ctx: nw.Context, folder: Path) -> None:
    value = torch.ones(1)
    dist.all_reduce(value)
    said = {
        "pid": os.getpid(),
        "master_addr": os.environ["MASTER_ADDR"],
        "master_port": int(os.environ["MASTER_PORT"]),
    }
    (folder / f"ready-{ctx.rank}.tmp").write_text(json.dumps(said), encoding="utf-8")
    (folder / f"ready-{ctx.rank}.tmp").rename(folder / f"ready-{ctx.rank}")
    deadline = time.monotonic() + 120
    with ctx.section(limit=150):
        while not (folder / "go").exists():
            if time.monotonic() > deadline:
                print(f"NO GO rank={ctx.rank}", flush=True)
                sys.exit(1)
            time.sleep(0.05)  # (a poll for the test's file, not a timing guess)
    dist.barrier()
    print(f"STORE BIND DONE rank={ctx.rank}", flush=True)


if __name__ == "__main__":
    nw.run(lambda ctx: main(ctx, Path(sys.argv[1])))

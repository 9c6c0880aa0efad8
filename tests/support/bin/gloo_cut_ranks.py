"""Two gloo ranks for test_gloo_cut.py: both reach an all_reduce; rank 1 instead cuts its
connections (``GlooLinks.cut``) and waits. Rank 0, blocked with a 300 s collective timeout,
must fail at once. Each rank prints what happened as ``RANK r: ...`` lines.

argv: RANK PORT
"""

from __future__ import annotations

import datetime
import sys
import time

import torch
import torch.distributed as dist

from nvtrain.worker.gloo_cut import GlooLinks

rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
with GlooLinks.noting() as links:
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300)
    )
tensor = torch.ones(4)
dist.all_reduce(tensor)
print(f"RANK {rank}: joined, {len(links.sockets)} sockets noted", flush=True)
store.set(f"ready{rank}", "1")
if rank == 1:
    store.wait(["ready0"])
    print(f"RANK 1: cut {links.cut()}", flush=True)
    store.wait(["rank0-done"], datetime.timedelta(seconds=60))
    sys.exit(0)
started = time.monotonic()
try:
    dist.all_reduce(tensor)
    print("RANK 0: all_reduce returned", flush=True)
except RuntimeError as exc:
    print(f"RANK 0: freed after {time.monotonic() - started:.1f}s: {exc}", flush=True)
store.set("rank0-done", "1")

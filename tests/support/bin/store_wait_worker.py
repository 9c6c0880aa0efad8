"""A gloo worker that holds its process group open until told to end.

``store_wait_worker.py DIR``: joins the process group (gloo, ``env://``), all-reduces once,
writes ``DIR/ready-<rank>`` (JSON: the rendezvous's run id, ``MASTER_PORT``) and prints
``STORE WAIT READY rank=<rank>``, then waits until ``DIR/go`` exists (at most 120 s: exit 1 with
``NO GO``), meets the other ranks once more and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.stdout.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]

folder = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.ones(1)
dist.all_reduce(value)
said = {"run_id": os.environ["TORCHELASTIC_RUN_ID"], "master_port": int(os.environ["MASTER_PORT"])}
(folder / f"ready-{rank}.tmp").write_text(json.dumps(said), encoding="utf-8")
(folder / f"ready-{rank}.tmp").rename(folder / f"ready-{rank}")
print(f"STORE WAIT READY rank={rank}", flush=True)
deadline = time.monotonic() + 120
while not (folder / "go").exists():
    if time.monotonic() > deadline:
        print(f"NO GO rank={rank}", flush=True)
        sys.exit(1)
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
print(f"STORE WAIT DONE rank={rank}", flush=True)

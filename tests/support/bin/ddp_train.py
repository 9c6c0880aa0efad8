"""A plain torchrun script (no nvtrain import): gloo DDP on CPU, a few steps of a tiny model.

Prints ``DDP ARGS <json of sys.argv[1:]> RANK=<r> WORLD_SIZE=<n>`` at start and
``DDP DONE RANK=<r> steps=<n> weight=<sum>`` at the end (the sums agree across ranks: DDP
averaged the gradients). ``--steps N`` is its own option; it accepts any others.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# One write per line: the ranks share the launcher's pipe, and with PYTHONUNBUFFERED a print
# is two writes (text, newline) that another rank's line can come between.
sys.stdout.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]

print(
    f"DDP ARGS {json.dumps(sys.argv[1:])} RANK={os.environ['RANK']} WORLD_SIZE={os.environ['WORLD_SIZE']}",
    flush=True,
)
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2)
args, _ = parser.parse_known_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)  # different data on each rank; DDP keeps the weights equal
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
weight = sum(float(p.detach().sum()) for p in model.parameters())
print(f"DDP DONE RANK={rank} steps={args.steps} weight={weight:.6f}", flush=True)
dist.destroy_process_group()

"""A plain torchrun DDP script: a small MLP on random data, a checkpoint every 10 steps with
torch.save (rank 0), resumed from on start. ``BENCH_*`` variables: see fault.py.

    torchrun --nproc-per-node 2 ddp_train.py --steps 60 --ckpt /tmp/ddp-ckpt
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from fault import main_started, step_done
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    main_started()
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(args.width, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 1)
    ).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    start = 0
    latest = args.ckpt / "latest.pt"
    if latest.exists():
        state = torch.load(latest, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    for step in range(start + 1, args.steps + 1):
        generator = torch.Generator().manual_seed(step * 1000 + dist.get_rank())
        x = torch.randn(32, args.width, generator=generator).to(device)
        loss = ddp(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_time)
        if step % 10 == 0 and dist.get_rank() == 0:
            args.ckpt.mkdir(parents=True, exist_ok=True)
            tmp = args.ckpt / "latest.tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
            os.replace(tmp, latest)
        step_done(step)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

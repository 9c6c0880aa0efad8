"""A torchrun-style training script: reads RANK, WORLD_SIZE, MASTER_ADDR... and nothing else."""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta


def main() -> None:
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(prog="python -m nvtrain.demo")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--step-time", type=float, default=0.05, help="extra seconds per step")
    parser.add_argument("--log-every", type=int, default=20)
    args = parser.parse_args()

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1000 + rank)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    print(f"DEMO rank {rank}/{world} started (restart {restart}, pid {os.getpid()})", flush=True)
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 32, generator=generator)
        loss = ((model(x) - x.sum(dim=1, keepdim=True) / 8) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        if world > 1:
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= world
        optimizer.step()
        time.sleep(args.step_time)
        if rank == 0 and step % args.log_every == 0:
            print(f"DEMO step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    print(f"DEMO rank {rank} finished", flush=True)


if __name__ == "__main__":
    main()

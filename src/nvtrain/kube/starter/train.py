"""A starter training script for nvtrain: a small FSDP2 model on synthetic data.

Replace the model, the data and the loss with yours; keep the shape of ``main``:

1. build the model and optimizer (every attempt builds them anew: after a fault the workers
   start ``main`` again, in the same process or in a new one);
2. ``ctx.checkpointer(model, optimizer)`` restores the newest committed checkpoint of this run
   and sets ``ctx.start_step``;
3. continue at ``ctx.start_step + 1`` and call ``ctx.step_done(step)`` after every optimizer
   step: it sends the heartbeat, saves a checkpoint when one is due and fires test faults.

Runs on GPUs with NCCL and on CPUs with gloo (``[job] backend`` in the policy). Start it with
``nvtrain run policy.toml``; ``python train.py`` alone runs one process without a launcher,
for debugging.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import nvtrain.worker as nw


def build(ctx: nw.Context, width: int, lr: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model, sharded with FSDP2 (each rank holds a slice of every layer), and its optimizer."""
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(32, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    ).to(ctx.device)
    if ctx.world_size > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def batch(step: int, rank: int, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data: the batch of a step depends only on (step, rank), so a replayed step sees
    the same data. A real data loader should be checkpointed too: pass it as ``extra``."""
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(size, 32, generator=gen)
    return x.to(device), (x.sum(dim=1, keepdim=True) / 8).to(device)


def main(ctx: nw.Context, args: argparse.Namespace) -> None:
    steps = args.steps or ctx.policy.job.max_steps or 1000
    model, optimizer = build(ctx, args.width, args.lr)
    ctx.checkpointer(model, optimizer)
    if ctx.rank == 0:
        print(f"TRAIN {ctx.world_size} ranks, steps {ctx.start_step + 1}..{steps}", flush=True)
    for step in range(ctx.start_step + 1, steps + 1):
        x, y = batch(step, ctx.rank, args.batch_size, ctx.device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if ctx.rank == 0 and step % args.log_every == 0:
            print(f"TRAIN step {step}/{steps} loss {loss.item():.5f}", flush=True)
        ctx.step_done(step, loss=loss.item())
    ctx.training_done()  # what follows makes no steps: it is not taken for a hang
    if dist.is_initialized():
        dist.barrier()
    if ctx.rank == 0:
        print(f"TRAIN finished {steps} steps", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="nvtrain starter: a small FSDP2 model on synthetic data")
    parser.add_argument("--steps", type=int, default=0, help="steps to train (default: [job] max_steps)")
    parser.add_argument("--width", type=int, default=256, help="hidden width of the model")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
    parser.add_argument("--log-every", type=int, default=50, help="print the loss every N steps")
    options = parser.parse_args()
    nw.run(lambda ctx: main(ctx, options))

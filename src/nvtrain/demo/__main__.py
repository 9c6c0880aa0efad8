"""The demo training script: a small FSDP2 model on synthetic data, using the worker library.

Deterministic: the batch of step N on rank R depends only on (N, R), and the checkpoint holds
everything else (model, optimizer, RNG states), so a run that recovers from faults ends with the
same weights as a run without faults.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

import torch
import torch.distributed as dist

import nvtrain.worker as nw


def build(
    ctx: nw.Context, width: int, depth: int, *, init: bool = True
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model and its optimizer. ``init=False``: the parameters are allocated but not
    initialised (built on the meta device, then ``to_empty``), for a state a checkpoint is about
    to overwrite: a replacement worker skips the init kernels (1.8 s of a warm start on an H200
    at ``--width 4096``)."""
    torch.manual_seed(0)
    # Initialised where it trains: no host-side init and copy.
    with torch.device(ctx.device if init else torch.device("meta")):
        layers: list[torch.nn.Module] = [torch.nn.Linear(32, width), torch.nn.ReLU()]
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
    if ctx.world_size > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    if not init:
        model.to_empty(device=ctx.device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def initialise(ctx: nw.Context, model: torch.nn.Module, width: int, depth: int) -> None:
    """Give a model built with ``init=False`` the parameters a fresh build has (the restore it
    was built for found nothing)."""
    fresh, _ = build(ctx, width, depth)
    with torch.no_grad():
        for mine, theirs in zip(model.parameters(), fresh.parameters(), strict=True):
            mine.copy_(theirs)


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 32, generator=gen)
    return x.to(device), (x.sum(dim=1, keepdim=True) / 8).to(device)


def say(line: str) -> None:
    """One line on stdout in one write: the ranks share the launcher's pipe, and a ``print``
    under ``PYTHONUNBUFFERED`` is two writes (text, newline) that another rank's can split."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def fingerprint(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """A hash of this rank's model and optimizer shards (bitwise)."""
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        local = value.to_local() if hasattr(value, "to_local") else value
        digest.update(name.encode() + local.detach().cpu().contiguous().numpy().tobytes())
    for group_state in optimizer.state.values():
        for key, value in sorted(group_state.items()):
            if isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value
                digest.update(key.encode() + local.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def main(ctx: nw.Context, args: argparse.Namespace) -> None:
    init = not ctx.restorable  # a checkpoint will overwrite the parameters: skip their init
    if ctx.world_size == 1:  # no process group inside: an in-process restart may keep them
        model, optimizer = ctx.reuse("model", lambda: build(ctx, args.width, args.depth, init=init))
    else:
        model, optimizer = build(ctx, args.width, args.depth, init=init)
    ctx.checkpointer(model, optimizer)
    if ctx.start_step == 0 and not init:
        initialise(ctx, model, args.width, args.depth)
    say(
        f"DEMO rank {ctx.rank}/{ctx.world_size} starts at step {ctx.start_step + 1} "
        f"(attempt {ctx.iteration}, restart {ctx.restart_count}, pid {os.getpid()})"
    )
    for step in range(ctx.start_step + 1, args.steps + 1):
        x, y = batch(step, ctx.rank, ctx.device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if args.step_time:
            import time

            time.sleep(args.step_time)
        if ctx.rank == 0 and step % args.log_every == 0:
            say(f"DEMO step {step}/{args.steps} loss {loss.item():.5f}")
        ctx.step_done(step, loss=round(loss.item(), 6))
    if dist.is_initialized():
        dist.barrier()
    with ctx.section():  # hashing a large model takes seconds: not a hang
        digest = fingerprint(model, optimizer)
    say(f"DEMO rank {ctx.rank} finished fingerprint {digest}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m nvtrain.demo")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=1, help="hidden width x width layers")
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--log-every", type=int, default=20)
    options = parser.parse_args()
    nw.run(lambda ctx: main(ctx, options))

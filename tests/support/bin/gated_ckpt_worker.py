"""A worker of the worker library that saves a checkpoint every ``interval`` steps (the policy's)
and, after step ``--gate-step``, waits for the file ``<gate>/go`` before it goes on; it makes
``<gate>/reached`` when it starts waiting. A test changes what is on disk at that moment.
Marker: ``GATED DONE step=<n>`` at the end."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import nvtrain.worker as nw


def main(ctx: nw.Context, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx.checkpointer(model, optimizer)
    gate = Path(args.gate)
    for step in range(ctx.start_step + 1, args.steps + 1):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        ctx.step_done(step)
        if step == args.gate_step:
            (gate / "reached").touch()
            with ctx.section():  # waiting for the test is not a hang
                while not (gate / "go").exists():
                    time.sleep(0.02)  # (a poll for the test's file, not a timing guess)
    sys.stdout.write(f"GATED DONE step={args.steps}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--gate", required=True)
    parser.add_argument("--gate-step", type=int, default=20)
    nw.run(lambda ctx: main(ctx, parser.parse_args()))

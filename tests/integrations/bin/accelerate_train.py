"""An ``accelerate`` loop under ``nvtrain.integrations.accelerate``: a small MLP with dropout
built from its sizes, AdamW with a warm-up schedule, shuffled data over several epochs through
``accelerator.prepare``: a resumed run matches a fault-free one only if model, optimizer,
scheduler, RNG states, the sampler's generator and the data position come back.

    nvtrain run policy.toml      # [job] script = this file, args = ["--steps", "24", "--out", DIR]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from common import fingerprint, linger, say, tokens

import nvtrain.integrations.accelerate as nvacc


def build(width: int = 32) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(width, 1)
    )


def main(ctx: Any, options: argparse.Namespace) -> None:
    set_seed(0)  # Python's, numpy's and torch's generators
    accelerator = Accelerator(cpu=True)
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))
    data = torch.stack([tokens(i) for i in range(24)])
    loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    loop = nvacc.Loop(
        ctx, accelerator, model, optimizer, loader, scheduler=scheduler, max_steps=options.steps
    )
    for step, batch in loop:
        x = batch.float() / 96
        loss = (model(x) - x.mean(dim=1, keepdim=True)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if accelerator.is_main_process:
            say(f"TRAIN step {step} loss {loss.item():.6f}")
    accelerator.wait_for_everyone()
    inner = accelerator.unwrap_model(model)
    digest = fingerprint(inner, optimizer, scheduler)
    say(f"TRAIN rank {accelerator.process_index} finished fingerprint {digest}")
    linger(options.linger)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--out", required=True)
    parser.add_argument("--linger", type=float, default=0.0, help="seconds of Python code after training")
    options = parser.parse_args()
    nvacc.run(lambda ctx: main(ctx, options))

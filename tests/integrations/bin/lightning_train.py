"""A Lightning script under ``nvtrain.integrations.lightning``: a small MLP with dropout built
from its sizes, AdamW with a warm-up schedule, shuffled data over several epochs (DDP's
distributed sampler), Lightning's default ``ModelCheckpoint``: a resumed run matches a
fault-free one only if model, optimizer, scheduler, RNG states and data position come back.

    nvtrain run policy.toml      # [job] script = this file, args = ["--steps", "24", "--out", DIR]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import lightning as L
import torch
from common import fingerprint, linger, say, tokens

import nvtrain.integrations.lightning as nvpl


class Net(L.LightningModule):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(width, 1)
        )

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        x = batch.float() / 96
        return (self.net(x) - x.mean(dim=1, keepdim=True)).pow(2).mean()

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


class Losses(L.Callback):
    """``TRAIN step N loss X`` for every optimizer step, rank 0's own loss."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
        if trainer.is_global_zero:
            say(f"TRAIN step {trainer.global_step} loss {outputs['loss'].item():.6f}")


def main(ctx: Any, options: argparse.Namespace) -> None:
    L.seed_everything(0, verbose=False)  # Python's, numpy's and torch's generators
    model = Net()
    data = torch.stack([tokens(i) for i in range(24)])
    loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=True)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    # Lightning's own saves every N steps (nvtrain's replace them, at that cadence when the
    # policy has no [checkpoint] interval).
    saves = (
        [L.pytorch.callbacks.ModelCheckpoint(every_n_train_steps=options.checkpoint_every)]
        if options.checkpoint_every
        else []
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=per_node,
        num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // per_node,
        strategy="ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto",
        max_steps=options.steps,
        default_root_dir=options.out,  # its ModelCheckpoint's folder: nvtrain's saves replace them
        callbacks=[Losses()] + saves,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    if options.ckpt_path:  # a call the integration refuses (exit 2 at once)
        nvpl.fit(ctx, trainer, model, train_dataloaders=loader, ckpt_path=options.ckpt_path)
    nvpl.fit(ctx, trainer, model, train_dataloaders=loader)
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    digest = fingerprint(model, trainer.optimizers[0], scheduler)
    say(f"TRAIN rank {trainer.global_rank} finished fingerprint {digest}")
    linger(options.linger)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--out", required=True)
    parser.add_argument("--linger", type=float, default=0.0, help="seconds of Python code after training")
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="ModelCheckpoint(every_n_train_steps=...)"
    )
    parser.add_argument("--ckpt-path", default="", help="call fit(..., ckpt_path=...)")
    options = parser.parse_args()
    nvpl.run(lambda ctx: main(ctx, options))

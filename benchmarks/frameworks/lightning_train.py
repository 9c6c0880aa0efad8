"""A Lightning script (``strategy="ddp"``, ``ModelCheckpoint`` every 10 steps, resumed from
``last.ckpt`` on start): a small MLP on random data. ``BENCH_*`` variables: see fault.py.

    torchrun --nproc-per-node 2 lightning_train.py --steps 60 --out /tmp/pl-out
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import lightning as L
import torch
from fault import main_started, step_done
from lightning.pytorch.callbacks import Callback, ModelCheckpoint


class Net(L.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
        )

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Clock(Callback):
    def __init__(self, step_time: float) -> None:
        self.step_time = step_time

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
        time.sleep(self.step_time)
        step_done(trainer.global_step)


def main() -> None:
    main_started()
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    data = torch.utils.data.DataLoader(torch.randn(4096, args.width), batch_size=32)
    checkpoints = ModelCheckpoint(dirpath=args.out, every_n_train_steps=10, save_last=True, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="gpu" if torch.cuda.is_available() else "cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp",
        max_steps=args.steps,
        callbacks=[checkpoints, Clock(args.step_time)],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    last = args.out / "last.ckpt"
    trainer.fit(Net(args.width), data, ckpt_path=str(last) if last.exists() else None)


if __name__ == "__main__":
    main()

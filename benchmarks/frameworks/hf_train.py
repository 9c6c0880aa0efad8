"""A Hugging Face ``Trainer`` script: a tiny GPT-2 (2 layers) on random tokens, a checkpoint
every 10 steps, resumed from the newest on start. ``BENCH_*`` variables: see fault.py.

    torchrun --nproc-per-node 2 hf_train.py --steps 60 --out /tmp/hf-out
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from fault import main_started, step_done
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


class Clock(TrainerCallback):  # type: ignore[misc]
    def __init__(self, step_time: float) -> None:
        self.step_time = step_time

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(self.step_time)
        step_done(state.global_step)


def main() -> None:
    main_started()
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--step-time", type=float, default=0.02)
    args = parser.parse_args()
    config = GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=str(args.out),
        max_steps=args.steps,
        per_device_train_batch_size=4,
        save_steps=10,
        save_total_limit=2,
        logging_steps=1000,
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        ddp_backend=None if torch.cuda.is_available() else "gloo",
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=[Clock(args.step_time)])
    last = get_last_checkpoint(str(args.out)) if args.out.is_dir() else None
    trainer.train(resume_from_checkpoint=last)


if __name__ == "__main__":
    main()

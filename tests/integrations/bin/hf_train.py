"""A Hugging Face ``Trainer`` script under ``nvtrain.integrations.hf``: a tiny GPT-2 built from a
config (nothing downloaded), with dropout, a linear warm-up schedule and shuffled data over
several epochs, so that a resumed run matches a fault-free one only if model, optimizer,
scheduler, RNG states and data position all come back.

    nvtrain run policy.toml      # [job] script = this file, args = ["--steps", "30", "--out", DIR]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from common import fingerprint, linger, say, tokens
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import nvtrain.integrations.hf as nvhf


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = tokens(index)
        return {"input_ids": ids, "labels": ids}


class Losses(TrainerCallback):
    """``TRAIN step N loss X`` for every step (logging_steps = 1: the loss of that step alone)."""

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if state.is_world_process_zero and logs and "loss" in logs:
            say(f"TRAIN step {state.global_step} loss {logs['loss']:.6f}")


def main(ctx: Any, options: argparse.Namespace) -> None:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=96, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=options.out,
        max_steps=options.steps,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        warmup_steps=5,
        logging_steps=1,
        save_steps=options.save_steps,  # the Trainer's own saves: nvtrain's async saves replace them
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo" if ctx.world_size > 1 else None,  # type: ignore[attr-defined]
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_level="error",
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Losses()])
    if options.resume_from_checkpoint:  # a call the integration refuses (exit 2 at once)
        nvhf.train(ctx, trainer, resume_from_checkpoint=True)
    nvhf.train(ctx, trainer)
    digest = fingerprint(trainer.model, trainer.optimizer, trainer.lr_scheduler)
    say(f"TRAIN rank {args.process_index} finished fingerprint {digest}")
    linger(options.linger)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True)
    parser.add_argument("--linger", type=float, default=0.0, help="seconds of Python code after training")
    parser.add_argument("--save-steps", type=int, default=10, help="TrainingArguments(save_steps=...)")
    parser.add_argument(
        "--resume-from-checkpoint", action="store_true", help="call train(..., resume_from_checkpoint=True)"
    )
    options = parser.parse_args()
    nvhf.run(lambda ctx: main(ctx, options))

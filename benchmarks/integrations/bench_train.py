"""One training script per framework, two ways: ``--mode plain`` is what a torchrun user runs
(the framework's own checkpoints every ``--save-every`` steps, resumed from the newest on
start, no nvtrain import); ``--mode nvtrain`` is the same script with nvtrain's integration
(``nvtrain.integrations.hf``, ``.lightning``, ``.accelerate``): async saves on the policy's
interval, in-process restarts, hang detection.

The model: a GPT-2 built from a config (``--layers``, ``--width``; nothing downloaded) on
random tokens, the same in all three frameworks. Rank 0 prints ``BENCH STEP <n> <unix time>``
after every optimizer step and ``BENCH MAIN 0 <unix time>`` when ``main()`` starts.

With ``--final PATH`` rank 0 ends by writing the model's floating-point state, flattened to
float32 in ``state_dict`` order, as raw bytes to PATH (``numpy.fromfile`` reads it back: nothing
pickled), and printing ``BENCH FINAL <loss>``: the loss of the final model on a fixed batch. Two
runs' files compared say how far a recovered run ends from a fault-free one
(``compare.py --tolerance``). ``--deterministic`` makes torch use deterministic kernels
(``torch.use_deterministic_algorithms(True)``: an op without one raises; with warnings only,
cuDNN attention's backward stayed nondeterministic on an H100) and ``CUBLAS_WORKSPACE_CONFIG``
must be set before the process starts.

Faults in ``--mode plain`` come from ``BENCH_FAULTS`` (``kind:step,...``; kinds ``exception``,
``sigkill``, ``hang``), fired on rank 0 once each (marker files in ``BENCH_FAULT_DIR``), each
announced by ``BENCH FAULT <kind> <step> <unix time>``. In ``--mode nvtrain`` they come from
the policy's ``[[faults]]`` (the events log records them).

    torchrun --nproc-per-node 8 bench_train.py --framework hf --mode plain --out /tmp/o
    nvtrain run policy.toml      # [job] script = this file, args = [..., "--mode", "nvtrain"]
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import Any

# All three at the top, in both modes and every framework: nvtrain's warm-start server preloads a
# script's top-level imports, and the plain arm pays the same imports at every start.
import accelerate
import lightning as L
import torch
import transformers


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def say(line: str) -> None:
    if rank() == 0:
        print(line, flush=True)


def plain_fault(step: int) -> None:
    """``--mode plain``: fire the fault ``BENCH_FAULTS`` plans at ``step`` (rank 0, once)."""
    if rank() != 0:
        return
    folder = Path(os.environ.get("BENCH_FAULT_DIR", "/nonexistent"))
    for entry in filter(None, os.environ.get("BENCH_FAULTS", "").split(",")):
        kind, _, at = entry.partition(":")
        mark = folder / f"{kind}-{at}.fired"
        if int(at) != step or not folder.is_dir() or mark.exists():
            continue
        mark.write_text("fired\n", encoding="utf-8")
        print(f"BENCH FAULT {kind} {step} {time.time():.6f}", flush=True)
        if kind == "exception":
            raise RuntimeError(f"bench: exception at step {step}")
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            while True:
                time.sleep(0.05)


def step_done(step: int, mode: str) -> None:
    say(f"BENCH STEP {step} {time.time():.6f}")
    if mode == "plain":
        plain_fault(step)


def gpt2(args: argparse.Namespace) -> Any:
    config = transformers.GPT2Config(
        vocab_size=args.vocab, n_positions=args.seq, n_embd=args.width, n_layer=args.layers, n_head=args.heads
    )
    torch.manual_seed(0)
    if args.build_on_device and torch.cuda.is_available():
        # What docs/integrations.md advises: the random initialisation runs on the GPU.
        with torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))):
            return transformers.GPT2LMHeadModel(config)
    return transformers.GPT2LMHeadModel(config)


def finish(model: torch.nn.Module, args: argparse.Namespace) -> None:
    """``--final``: rank 0 writes the model's state and prints its loss on a fixed batch."""
    if args.final is None or rank() != 0:
        return
    state = [v for v in model.state_dict().values() if torch.is_floating_point(v)]
    flat = torch.cat([v.detach().reshape(-1).float().cpu() for v in state])
    flat.numpy().tofile(args.final)
    batch = torch.stack([Tokens(args.vocab, args.seq)[i] for i in range(args.batch)])
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss = model(input_ids=batch.to(device), labels=batch.to(device)).loss
    model.train(was_training)
    say(f"BENCH FINAL {float(loss):.8f}")


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, vocab: int, seq: int, size: int = 100_000) -> None:
        self.vocab, self.seq, self.size = vocab, seq, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, (self.seq,), generator=torch.Generator().manual_seed(index))


# -- Hugging Face Trainer -------------------------------------------------------------------


def hf_main(ctx: Any, args: argparse.Namespace) -> None:
    from transformers.trainer_utils import get_last_checkpoint

    class Data(Tokens):
        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:  # type: ignore[override]
            ids = super().__getitem__(index)
            return {"input_ids": ids, "labels": ids}

    class Clock(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, a, state, control, **kwargs):  # type: ignore[no-untyped-def]
            step_done(state.global_step, args.mode)

    cuda = torch.cuda.is_available()
    training = transformers.TrainingArguments(
        output_dir=str(args.out),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        save_steps=args.save_every,
        save_total_limit=2,
        logging_steps=10_000,
        report_to=[],
        use_cpu=not cuda,
        bf16=cuda,
        ddp_backend=None if cuda or int(os.environ.get("WORLD_SIZE", "1")) == 1 else "gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    data = Data(args.vocab, args.seq)
    trainer = transformers.Trainer(model=gpt2(args), args=training, train_dataset=data, callbacks=[Clock()])
    if args.mode == "nvtrain":
        import nvtrain.integrations.hf as nvhf

        nvhf.train(ctx, trainer)
    else:
        last = get_last_checkpoint(str(args.out)) if args.out.is_dir() else None
        trainer.train(resume_from_checkpoint=last)
    finish(trainer.model, args)


# -- Lightning ------------------------------------------------------------------------------


def lightning_main(ctx: Any, args: argparse.Namespace) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = gpt2(args)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.model(input_ids=batch, labels=batch).loss  # type: ignore[no-any-return]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
            step_done(trainer.global_step, args.mode)

    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    checkpoints = ModelCheckpoint(
        dirpath=args.out, every_n_train_steps=args.save_every, save_last=True, save_top_k=1
    )
    trainer = L.Trainer(
        accelerator="gpu" if torch.cuda.is_available() else "cpu",
        devices=per_node,
        num_nodes=world // per_node,
        strategy="ddp" if world > 1 else "auto",
        precision="bf16-mixed" if torch.cuda.is_available() else "32-true",
        max_steps=args.steps,
        callbacks=[checkpoints, Clock()],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    loader = torch.utils.data.DataLoader(Tokens(args.vocab, args.seq), batch_size=args.batch, shuffle=True)
    if args.mode == "nvtrain":
        import nvtrain.integrations.lightning as nvpl

        net = Net()
        nvpl.fit(ctx, trainer, net, train_dataloaders=loader)
    else:
        net = Net()
        last = args.out / "last.ckpt"
        trainer.fit(net, loader, ckpt_path=str(last) if last.exists() else None)
    finish(net.model, args)


# -- accelerate -----------------------------------------------------------------------------


def accelerate_main(ctx: Any, args: argparse.Namespace) -> None:
    cuda = torch.cuda.is_available()
    accelerator = accelerate.Accelerator(cpu=not cuda, mixed_precision="bf16" if cuda else "no")
    model = gpt2(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(Tokens(args.vocab, args.seq), batch_size=args.batch, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def train_step(batch: torch.Tensor) -> None:
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    if args.mode == "nvtrain":
        import nvtrain.integrations.accelerate as nvacc

        loop = nvacc.Loop(ctx, accelerator, model, optimizer, loader, max_steps=args.steps)
        for step, batch in loop:
            train_step(batch)
            step_done(step, args.mode)
        finish(accelerator.unwrap_model(model), args)
        return
    # plain: accelerate's own save_state every --save-every steps, the newest loaded on start
    saved = (
        sorted(args.out.glob("step-*"), key=lambda p: int(p.name.split("-")[1])) if args.out.is_dir() else []
    )
    step = 0
    if saved:
        accelerator.load_state(str(saved[-1]))
        step = int(saved[-1].name.split("-")[1])
    per_epoch = len(loader)
    while step < args.steps:
        epoch, done = divmod(step, per_epoch)
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, done) if done else loader
        for batch in batches:
            train_step(batch)
            step += 1
            step_done(step, args.mode)
            if step % args.save_every == 0:
                accelerator.save_state(str(args.out / f"step-{step}"))
            if step >= args.steps:
                break
    finish(accelerator.unwrap_model(model), args)


FRAMEWORKS = {"hf": hf_main, "lightning": lightning_main, "accelerate": accelerate_main}


def main() -> None:
    say(f"BENCH MAIN 0 {time.time():.6f}")
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), required=True)
    parser.add_argument("--mode", choices=["plain", "nvtrain"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--save-every", type=int, default=20, help="plain mode; nvtrain: the policy")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument(
        "--final", type=Path, help="rank 0 writes the final state here (raw float32; in a folder that exists)"
    )
    parser.add_argument(
        "--deterministic", action="store_true", help="deterministic kernels (an op without one raises)"
    )
    parser.add_argument(
        "--build-on-device", action="store_true", help="build the model on the rank's GPU, not on the CPU"
    )
    args = parser.parse_args()
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    train = FRAMEWORKS[args.framework]
    if args.mode == "plain":
        train(None, args)
        return
    import nvtrain.integrations.core as core

    core.run(lambda ctx: train(ctx, args), before_attempt=core.reset_accelerate_state)


if __name__ == "__main__":
    main()

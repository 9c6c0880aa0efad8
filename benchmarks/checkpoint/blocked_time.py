"""Checkpoint blocked time: nvtrain's async save against the pinned-memory floor and torch's paths.

Builds an FSDP2 model (one process, world of one; NCCL on a GPU, gloo on a CPU) whose model plus
AdamW state is about --size-gb, then, alternating arms, saves it several times:

  nvtrain-async   nvtrain.worker.Checkpointer, async (reused staging buffers, pinned on GPUs)
  dcp-async       torch.distributed.checkpoint.async_save with its default staging
  nvtrain-sync    nvtrain.worker.Checkpointer, async = false (the loop waits for the write)
  nvtrain-async-shm      async, staging into the host copy in --shm (files that outlive the worker)
  nvtrain-async-<N>w     async, torch's writer with N threads (files) per rank instead of 1

With --prepare, each nvtrain async arm prepares (allocates and pins) its buffers in the
background before its first save, as a training loop does on its first step that is not due
(``Checkpointer.prepare``); the time that took is reported apart, and the first save's blocked
time is then comparable with the later ones. --disk-gb measures the checkpoint disk's
sequential write rate first (written in 64 MiB blocks, then fsync), for the write-rate column.

and reports the median time the training loop was blocked per save. On a GPU the floor is
state bytes / pinned device-to-host bandwidth, measured here with one large copy.

    python benchmarks/checkpoint/blocked_time.py --size-gb 8 --saves 3 --dir /tmp/ckpt
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib.host import disk_rate  # noqa: E402

from nvtrain.config.schema import Checkpoint  # noqa: E402
from nvtrain.events import EventLog, read_events  # noqa: E402
from nvtrain.events.records import CheckpointStaged  # noqa: E402
from nvtrain.worker.checkpoint import Checkpointer  # noqa: E402


def pinned_bandwidth(gib: float = 2.0, repeats: int = 5) -> float:
    """Device-to-host copy into pinned memory, bytes per second (median)."""
    n = int(gib * (1 << 30)) // 4
    src = torch.empty(n, dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty(n, dtype=torch.float32, pin_memory=True)
    rates = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(n * 4 / (time.perf_counter() - t0))
    del src, dst
    return statistics.median(rates[1:])


def build(size_gb: float, device: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    width = 8192 if device.type == "cuda" else 1024
    # fp32 params + AdamW exp_avg + exp_avg_sq = 12 bytes per parameter
    layers = max(1, round(size_gb * (1 << 30) / (12 * width * width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    model.to(device)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):
        loss = model(torch.randn(8, width, device=device)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for group in optimizer.state.values():
        for value in group.values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gb", type=float, default=8.0)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/nvtrain-ckpt-bench")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--arms", default="nvtrain-async,dcp-async,nvtrain-sync", help="comma-separated, in turn"
    )
    parser.add_argument("--prepare", action="store_true", help="prepare buffers before the first save")
    parser.add_argument("--shm", default="/dev/shm/nvtrain-blocked-time", help="host copy folder")
    parser.add_argument("--disk-gb", type=float, default=0.0, help="measure the disk's write rate first")
    parser.add_argument(
        "--step-time", type=float, default=1.0, help="step time (s) for the checkpoint-efficiency column"
    )
    parser.add_argument(
        "--interval", type=int, default=100, help="steps between saves for the checkpoint-efficiency column"
    )
    args = parser.parse_args()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(0)
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    model, optimizer = build(args.size_gb, device)
    nbytes = state_bytes(model, optimizer)
    bandwidth = pinned_bandwidth() if cuda else None
    disk = disk_rate(root, args.disk_gb) if args.disk_gb else None
    events = EventLog(root / "events.jsonl")
    arms = args.arms.split(",")
    shm = Path(args.shm)
    shutil.rmtree(shm, ignore_errors=True)
    shm.mkdir(parents=True)
    ckpt = {
        mode: Checkpointer(
            model=model,
            optimizer=optimizer,
            run_dir=root / mode,
            policy=Checkpoint(dir=str(root), interval=1, keep=1, **{"async": mode != "nvtrain-sync"}),
            events=events,
            host_copy_dir=str(shm) if mode == "nvtrain-async-shm" else "",
            write_threads=int(mode.rsplit("-", 1)[1][:-1]) if mode.endswith("w") else 1,
        )
        for mode in arms
        if mode != "dcp-async"
    }
    prepared: dict[str, float] = {}
    if args.prepare:
        for mode, c in ckpt.items():
            t0 = time.perf_counter()
            ready = c.prepare()
            if ready is not None:
                ready.wait()
                prepared[mode] = round(time.perf_counter() - t0, 3)
        print(f"buffers prepared in the background before the first save (s): {prepared}", flush=True)
    blocked: dict[str, list[float]] = {mode: [] for mode in arms}
    background: dict[str, list[float]] = {k: [] for k in blocked}
    gloo = dist.new_group(backend="gloo")  # DCP's async path needs a CPU-capable group
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import async_save

    for i in range(1, args.saves + 1):
        for mode in blocked:
            step = i
            t0 = time.perf_counter()
            if mode == "dcp-async":
                msd, osd = get_state_dict(model, optimizer)
                future = async_save(
                    {"model": msd, "optim": osd},
                    checkpoint_id=str(root / mode / f"step-{step}"),
                    process_group=gloo,
                )
                if cuda:
                    torch.cuda.synchronize()
                blocked[mode].append(time.perf_counter() - t0)
                future.result()
                background[mode].append(time.perf_counter() - t0)
                shutil.rmtree(root / mode, ignore_errors=True)
            else:
                ckpt[mode].save(step)
                if cuda:
                    torch.cuda.synchronize()
                blocked[mode].append(time.perf_counter() - t0)
                ckpt[mode].wait()
                background[mode].append(time.perf_counter() - t0)
            print(
                f"save {i} {mode}: blocked {blocked[mode][-1]:.3f}s, "
                f"until committed {background[mode][-1]:.3f}s",
                flush=True,
            )
    for c in ckpt.values():
        c.close()
    shutil.rmtree(shm, ignore_errors=True)
    staged = [e.blocked_s for e in read_events(root / "events.jsonl") if isinstance(e, CheckpointStaged)]
    floor = nbytes / bandwidth if bandwidth else None
    result = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "state_bytes": nbytes,
        "pinned_d2h_GBps": round(bandwidth / 1e9, 2) if bandwidth else None,
        "floor_s": round(floor, 4) if floor else None,
        "saves": args.saves,
        "blocked_s": {k: [round(x, 4) for x in v] for k, v in blocked.items()},
        "until_committed_s": {k: [round(x, 4) for x in v] for k, v in background.items()},
        "events_blocked_s": staged,
        "prepared_s": prepared,
        "disk_GBps": round(disk, 3) if disk else None,
        "write_GBps": {k: [round(nbytes / x / 1e9, 3) for x in v] for k, v in background.items()},
    }
    between = args.interval * args.step_time
    print(f"\nefficiency = {args.interval} steps x {args.step_time} s / (that + blocked per save)")
    print(
        "\n| arm | first save blocked (s) | steady (saves 2..) median | x floor | median until written (s) "
        f"| write GB/s (x disk) | efficiency at {args.interval} x {args.step_time} s |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode, values in blocked.items():
        steady = statistics.median(values[1:]) if len(values) > 1 else values[0]
        ratio = f"{steady / floor:.2f}" if floor else "-"
        written = statistics.median(background[mode])
        rate = nbytes / written / 1e9
        vs_disk = f" ({rate / disk:.2f})" if disk else ""
        print(
            f"| {mode} | {values[0]:.3f} | {steady:.3f} | {ratio} | "
            f"{written:.3f} | {rate:.2f}{vs_disk} | {between / (between + steady):.2%} |"
        )
    if disk:
        print(f"checkpoint disk sequential write: {disk:.2f} GB/s")
    print(
        f"\nstate {nbytes / 1e9:.2f} GB; pinned D2H "
        f"{(bandwidth or 0) / 1e9:.1f} GB/s; floor {floor or 0:.3f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

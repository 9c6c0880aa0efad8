"""Can two ranks share one GPU under NCCL? Issue 19 needs a live NCCL peer; on a machine with one
GPU this shows why it cannot be had there: two processes, both on cuda:0, join one NCCL group
and all-reduce a tensor. Prints what happened to each rank; exit 0 either way.

    python3 benchmarks/recovery/one_gpu_two_ranks.py
"""

from __future__ import annotations

import os
import socket
import sys
import traceback


def rank_main(rank: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    try:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", 0))
        value = torch.ones(4, device="cuda") * (rank + 1)
        dist.all_reduce(value)
        torch.cuda.synchronize()
        print(f"rank {rank}: all_reduce gave {value[0].item():.0f} (expected 3)", flush=True)
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the point is to report it
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        print(f"rank {rank}: {last[:600]}", flush=True)


def main() -> int:
    import torch
    import torch.multiprocessing as mp

    print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, GPUs: {torch.cuda.device_count()}")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    procs = [context.Process(target=rank_main, args=(rank, port)) for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
        if proc.is_alive():
            proc.kill()
            print(f"pid {proc.pid}: still running after 120 s, killed")
    print("exit codes:", [proc.exitcode for proc in procs])
    return 0


if __name__ == "__main__":
    sys.exit(main())

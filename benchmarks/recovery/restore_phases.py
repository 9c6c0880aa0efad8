"""Where a warm replacement worker's "restore" phase goes (issue 16), on a GPU machine.

The parent imports what the warm-start server imports (``nvtrain.zygote.server.BASE`` and the
demo), then forks ``--forks`` children one after another, as the server does for a replacement
worker. Each child times, in the order a worker of the demo runs them: ``torch.cuda.set_device``,
``init_process_group`` (NCCL, a world of one, over a TCPStore the parent serves), the first CUDA
allocation and the first kernel, the demo's model built uninitialised (as when it will restore)
and then initialised (``--width``, ``--depth``) with its optimizer, one optimizer step (so that
it has state, as a restored one does), the checkpointer's own gloo group, ``get_state_dict`` and
one all-reduce on that group; then prints them as a JSON line. Medians over the forks at the end.

    python benchmarks/recovery/restore_phases.py --width 4096 --forks 3
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
import _lib  # noqa: E402, F401  (this tree's src first on the path)


def child(args: argparse.Namespace, port: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from nvtrain.demo.__main__ import batch, build

    times: dict[str, float] = {}
    last = time.monotonic()

    def mark(name: str) -> None:
        nonlocal last
        now = time.monotonic()
        times[name] = round(now - last, 4)
        last = now

    torch.cuda.set_device(0)
    mark("set_device")
    store = dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    mark("init_process_group")
    one = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    mark("first_allocation")
    one.add_(1)
    torch.cuda.synchronize()
    mark("first_kernel")
    if args.first_uses:  # what a first build pays once per process, one piece at a time
        torch.manual_seed(0)
        mark("first_manual_seed")
        tiny = torch.nn.Linear(8, 8, device="meta")
        mark("first_meta_module")
        tiny.to_empty(device="cuda")
        mark("first_to_empty")
        torch.optim.AdamW(tiny.parameters(), lr=1e-3)
        mark("first_optimizer")
    ctx = SimpleNamespace(device=torch.device("cuda", 0), world_size=1, rank=0)
    model, optimizer = build(ctx, args.width, args.depth, init=False)  # type: ignore[arg-type]
    torch.cuda.synchronize()
    mark("build_uninitialised")
    model, optimizer = build(ctx, args.width, args.depth)  # type: ignore[arg-type]
    torch.cuda.synchronize()
    mark("build")
    x, y = batch(1, 0, ctx.device)
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    torch.cuda.synchronize()
    mark("first_step")
    group = dist.new_group(backend="gloo")
    mark("gloo_group")
    get_state_dict(model, optimizer)
    mark("get_state_dict")
    dist.all_reduce(torch.zeros(1), group=group)
    mark("gloo_all_reduce")
    dist.destroy_process_group()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--forks", type=int, default=3)
    parser.add_argument("--first-uses", action="store_true", help="time the first uses one by one")
    parser.add_argument("--preimport", default="", help="modules (comma-separated) the parent imports too")
    args = parser.parse_args()
    from nvtrain.zygote.server import BASE

    t0 = time.monotonic()
    for name in (*BASE, "nvtrain.demo.__main__", *filter(None, args.preimport.split(","))):
        importlib.import_module(name)
    print(json.dumps({"parent_imports_s": round(time.monotonic() - t0, 3)}), flush=True)
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    runs = []
    for _ in range(args.forks):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            result = child(args, server.port)
            os.write(write, json.dumps(result).encode())
            os._exit(0)
        os.close(write)
        data = b""
        while chunk := os.read(read, 65536):
            data += chunk
        os.waitpid(pid, 0)
        runs.append(json.loads(data))
        print(json.dumps(runs[-1]), flush=True)
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(json.dumps({"median": medians, "total": round(sum(medians.values()), 3)}), flush=True)


if __name__ == "__main__":
    main()

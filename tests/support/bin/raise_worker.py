"""Gloo, 2 ranks: all-reduce in a loop; rank ``--raise-rank`` raises ``RuntimeError`` at step
``--step`` (torch.distributed prints its traceback as ``[rank1]: ...``). The other rank's
collective then breaks; it exits with code 2 at once, so ft_launcher usually finds both dead in
one look, and names the lowest local rank."""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

# One write per line: the ranks share the launcher's pipe, and with PYTHONUNBUFFERED a print
# is two writes (text, newline) that another rank's line can come between.
sys.stdout.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--raise-rank", type=int, default=1)
    parser.add_argument("--step", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor = torch.zeros(1)
    for step in range(1_000_000):
        if rank == args.raise_rank and step == args.step:
            raise RuntimeError(f"boom at step {step}")
        try:
            dist.all_reduce(tensor)
        except Exception as exc:
            print(f"WORKER PEER LOST rank={rank}: {exc}", file=sys.stderr, flush=True)
            os._exit(2)


if __name__ == "__main__":
    main()

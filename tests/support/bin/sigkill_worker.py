"""A torchrun-style gloo worker; on the first attempt rank ``--kill-rank`` SIGKILLs itself.

Reads only what ft_launcher gives every torchrun script (RANK, WORLD_SIZE, MASTER_ADDR, ...,
TORCHELASTIC_RESTART_COUNT). Markers on stdout: ``WORKER START``, ``WORKER STEP``,
``WORKER SIGKILL``, ``WORKER DONE``.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from datetime import timedelta


def main() -> None:
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("--kill-step", type=int, default=2)
    parser.add_argument("--step-time", type=float, default=0.05)
    args = parser.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    print(f"WORKER START rank={rank} world={world} restart={restart} pid={os.getpid()}", flush=True)
    for step in range(1, args.steps + 1):
        value = torch.ones(4)
        dist.all_reduce(value)
        assert value[0].item() == world
        print(f"WORKER STEP rank={rank} step={step} restart={restart}", flush=True)
        if restart == "0" and step == args.kill_step:
            if rank == args.kill_rank:
                print(f"WORKER SIGKILL rank={rank} step={step} pid={os.getpid()}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            # The survivors stay out of collectives for a few monitor intervals. A gloo peer
            # that dies makes the next collective fail at once; if both ranks were dead at
            # ft_launcher's next poll, it would name whichever failure it lists first (its
            # timestamps have whole-second resolution) instead of the SIGKILL.
            time.sleep(4.0)
        time.sleep(args.step_time)
    dist.barrier()
    dist.destroy_process_group()
    print(f"WORKER DONE rank={rank} restart={restart}", flush=True)


if __name__ == "__main__":
    main()

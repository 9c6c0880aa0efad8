"""Gloo, 2 ranks: an all-reduce and a heartbeat (NVRx ``RankMonitorClient``) per step. On the
first attempt rank ``--hang-rank`` hangs after step ``--hang-step``: it beats for
``--last-beats`` more seconds while its peer already waits for it in the next all-reduce (so the
peer's heartbeats stop first, and the peer's rank monitor fires first), then either stops itself
with SIGSTOP (``--how stop``) or sleeps in Python for ever (``--how sleep``).
Markers: ``WORKER START``, ``WORKER STEP``, ``WORKER HANG rank=R pid=P``, ``WORKER DONE``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

sys.stdout.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]


def main() -> None:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hang-rank", type=int, default=1)
    parser.add_argument("--hang-step", type=int, default=2)
    parser.add_argument("--how", choices=["stop", "sleep"], default="stop")
    parser.add_argument("--last-beats", type=float, default=2.5)
    args = parser.parse_args()

    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.send_heartbeat()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"WORKER START rank={rank} restart={restart} pid={os.getpid()}", flush=True)
    tensor = torch.zeros(1)
    for step in range(1, args.steps + 1):
        dist.all_reduce(tensor)
        client.send_heartbeat()
        print(f"WORKER STEP rank={rank} step={step} restart={restart}", flush=True)
        if restart == "0" and rank == args.hang_rank and step == args.hang_step:
            deadline = time.monotonic() + args.last_beats
            while time.monotonic() < deadline:
                time.sleep(0.25)
                client.send_heartbeat()
            print(f"WORKER HANG rank={rank} pid={os.getpid()}", flush=True)
            if args.how == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            while True:
                time.sleep(60)
        time.sleep(0.1)
    client.shutdown_workload_monitoring()
    print(f"WORKER DONE rank={rank} restart={restart}", flush=True)


if __name__ == "__main__":
    main()

"""A worker that heartbeats through NVRx's RankMonitorClient; on the first attempt rank
``--hang-rank`` stops heartbeating after ``--hang-step`` steps and sleeps forever.

Steps use no collective: a hung peer would block the others in it, their heartbeats would stop
too, and which monitor fires first would be a race. Here only the hung rank's monitor fires.
Markers: ``WORKER START``, ``WORKER HEARTBEAT rank=R step=S restart=C t=<unix time>``,
``WORKER HANG``, ``WORKER DONE``.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hang-rank", type=int, default=1)
    parser.add_argument("--hang-step", type=int, default=3)
    parser.add_argument("--step-time", type=float, default=0.2)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    client = RankMonitorClient()
    client.init_workload_monitoring()
    # A heartbeat right after init: NVRx's first-heartbeat bug (docs/nvrx.md section 3).
    client.send_heartbeat()
    print(f"WORKER START rank={rank} restart={restart} pid={os.getpid()}", flush=True)
    for step in range(1, args.steps + 1):
        if restart == "0" and rank == args.hang_rank and step > args.hang_step:
            print(f"WORKER HANG rank={rank} step={step} t={time.time():.3f}", flush=True)
            while True:
                time.sleep(60)
        time.sleep(args.step_time)
        client.send_heartbeat()
        print(f"WORKER HEARTBEAT rank={rank} step={step} restart={restart} t={time.time():.3f}", flush=True)
    client.shutdown_workload_monitoring()
    print(f"WORKER DONE rank={rank} restart={restart}", flush=True)


if __name__ == "__main__":
    main()

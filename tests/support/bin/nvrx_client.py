"""A training loop on NVRx's client API alone, as an ft_launcher user writes it (no nvtrain).

``--mode heartbeats``: ``send_heartbeat()`` every step; after ``--calc-step`` steps, if the
config has no timeouts (``not client.hb_timeouts.are_valid``), ``calculate_and_set_hb_timeouts()``
(a collective: every rank calls it at that step). ``--mode sections``: an ``init`` section, a
``step`` section per step, a ``checkpoint`` section every ``--save-every`` steps, no heartbeats.

On the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0) rank ``--hang-rank`` hangs at step
``--hang-step``: heartbeats: it stops itself (SIGSTOP; the rank monitor sends SIGCONT, then
SIGKILL); sections: it sleeps inside its ``step`` section. No collective follows the
calculation, so only the hung rank's monitor can fire. Markers (unix times): ``CLIENT START``,
``CLIENT TIMEOUTS``, ``CLIENT HANG ... t=``, ``CLIENT DONE``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

# One write per line: the ranks share the launcher's pipe, and with PYTHONUNBUFFERED a print
# is two writes (text, newline) that another rank's line can come between.
sys.stdout.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]


def main() -> None:
    import torch.distributed as dist
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["heartbeats", "sections"], default="heartbeats")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--step-time", type=float, default=0.5)
    parser.add_argument("--calc-step", type=int, default=4)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--hang-rank", type=int, default=1)
    parser.add_argument("--hang-step", type=int, default=0, help="0: no hang")
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    client = RankMonitorClient()
    client.init_workload_monitoring()
    print(f"CLIENT START rank={rank} restart={restart} t={time.time():.3f}", flush=True)
    sections = args.mode == "sections"
    if sections:
        client.start_section("init")
        time.sleep(args.step_time)
        client.end_section("init")
    for step in range(1, args.steps + 1):
        if sections:
            client.start_section("step")
        if restart == 0 and rank == args.hang_rank and step == args.hang_step:
            print(f"CLIENT HANG rank={rank} step={step} t={time.time():.3f}", flush=True)
            if sections:
                time.sleep(3600)
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(args.step_time)
        if sections:
            client.end_section("step")
            if step % args.save_every == 0:
                client.start_section("checkpoint")
                time.sleep(args.step_time)
                client.end_section("checkpoint")
            continue
        client.send_heartbeat()
        if step == args.calc_step and not client.hb_timeouts.are_valid:
            client.calculate_and_set_hb_timeouts()
            print(f"CLIENT TIMEOUTS rank={rank} {client.hb_timeouts}", flush=True)
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    print(f"CLIENT DONE rank={rank} restart={restart}", flush=True)


if __name__ == "__main__":
    main()

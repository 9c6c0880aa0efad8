"""A plain-Python ft_launcher worker for record_nvrx_logs.sh: heartbeats, then one planned fault.

No torch.distributed and no GPU: each rank connects to its NVRx rank monitor, sends a heartbeat
every step and, on ``--fault-rank`` at ``--fault-step``, does one of

    exit3    exits with code 3
    sigkill  SIGKILLs itself
    hang     stops heartbeating and sleeps (the rank monitor must kill it)
    none     nothing (runs all steps)

A fault fires at most ``--times`` times per recording, across restarts: before firing, the rank
creates ``<state-dir>/fired.<n>``. Each rank prints one ``WORKER <event> ...`` line per event.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path


def _say(event: str, rank: int, **fields: object) -> None:
    extra = "".join(f" {k}={v}" for k, v in fields.items())
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    line = f"WORKER {event} rank={rank} pid={os.getpid()} restart={restart}{extra}\n"
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), line.encode())  # one write(2): ranks share the launcher's pipe


def _claim_fault(state: Path, times: int) -> bool:
    """True (and one more ``fired.<n>`` file) while fewer than ``times`` faults have fired."""
    state.mkdir(parents=True, exist_ok=True)
    fired = len(list(state.glob("fired.*")))
    if fired >= times:
        return False
    (state / f"fired.{fired}").touch()
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", choices=["none", "exit3", "sigkill", "hang"], default="none")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=4)
    parser.add_argument("--times", type=int, default=1, help="how often the fault fires in all")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--step-time", type=float, default=0.25, help="seconds per step")
    parser.add_argument("--state-dir", required=True)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    _say("start", rank, world=os.environ.get("WORLD_SIZE"))
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.send_heartbeat()  # at once: see nvrx.md §3, "first-heartbeat bug"
    _say("ready", rank)
    for step in range(1, args.steps + 1):
        time.sleep(args.step_time)
        client.send_heartbeat()
        if (
            args.fault != "none"
            and rank == args.fault_rank
            and step == args.fault_step
            and _claim_fault(Path(args.state_dir), args.times)
        ):
            _say("fault", rank, kind=args.fault, step=step)
            if args.fault == "exit3":
                sys.exit(3)
            if args.fault == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            while True:  # hang: no more heartbeats
                time.sleep(60)
    client.shutdown_workload_monitoring()
    _say("done", rank, steps=args.steps)


if __name__ == "__main__":
    main()

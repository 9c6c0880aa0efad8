"""A training script on nvtrain's worker library whose start-up (model build, data loading)
takes ``--startup`` seconds before the first step. Markers: ``WORKER BUILDING``, ``WORKER STEP``,
``WORKER DONE``.
"""

from __future__ import annotations

import argparse
import os
import time

import nvtrain.worker as nw


def main(ctx: nw.Context, args: argparse.Namespace) -> None:
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    print(f"WORKER BUILDING rank={ctx.rank} restart={restart} t={time.time():.3f}", flush=True)
    time.sleep(args.startup)
    for step in range(1, args.steps + 1):
        time.sleep(0.1)
        ctx.step_done(step)
        print(f"WORKER STEP rank={ctx.rank} step={step} restart={restart}", flush=True)
    print(f"WORKER DONE rank={ctx.rank} restart={restart}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--startup", type=float, default=7.0)
    parser.add_argument("--steps", type=int, default=3)
    options = parser.parse_args()
    nw.run(lambda ctx: main(ctx, options))

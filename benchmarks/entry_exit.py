"""What ``python -m nvtrain.entry`` costs a worker against ``python SCRIPT``: the time from the
script's last line to the process's end, and the whole process, side by side.

The script imports torch, builds a small model, runs a few optimizer steps on a one-rank gloo
group, destroys the group and prints the time; the parent notes when the process has ended.
Alternates the two ways of running it (``python``, ``entry``) so that both see the same machine.

    python benchmarks/entry_exit.py [--runs 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _lib import cli
from _lib.procs import free_port

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(32, 256)).sum().backward()
        opt.step()
    dist.destroy_process_group()
    print(f"END {time.time():.6f}", flush=True)
    """
)


def _one(prefix: list[str], script: Path) -> tuple[float, float, int]:
    """(seconds from the script's last line to the process's end, the whole process, exit code)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    start = time.time()
    done = subprocess.run([*prefix, str(script)], env=env, capture_output=True, text=True, check=False)
    ended = time.time()
    lines = [line for line in done.stdout.splitlines() if line.startswith("END ")]
    if not lines:
        raise SystemExit(f"no END line (exit {done.returncode}): {done.stderr[-2000:]}")
    return ended - float(lines[-1].split()[1]), ended - start, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    ways = {"python": [sys.executable], "entry": [sys.executable, "-m", "nvtrain.entry"]}
    results: dict[str, dict[str, list[float]]] = {
        way: {"exit_s": [], "process_s": [], "codes": []} for way in ways
    }
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPT)
        for _ in range(args.runs):
            for way, prefix in ways.items():
                exit_s, process_s, code = _one(prefix, script)
                results[way]["exit_s"].append(exit_s)
                results[way]["process_s"].append(process_s)
                results[way]["codes"].append(code)
    summary = {
        way: {
            "exit_s_median": statistics.median(r["exit_s"]),
            "process_s_median": statistics.median(r["process_s"]),
            "exit_codes": r["codes"],
        }
        for way, r in results.items()
    }
    for way, s in summary.items():
        print(
            f"{way:7s} last line -> exit: {s['exit_s_median'] * 1000:6.0f} ms median, "
            f"whole process {s['process_s_median']:.2f} s median, exit codes {s['exit_codes']}"
        )
    ratio = summary["entry"]["exit_s_median"] / summary["python"]["exit_s_median"]
    print(f"entry / python, last line -> exit: {ratio:.2f} ({args.runs} runs each, alternated)")
    cli.write_json(args.json, {"runs": args.runs, "summary": summary, "raw": results})


if __name__ == "__main__":
    main()

"""What one ``nvtrain run`` of the CPU demo costs, cold and warm: where the test suite's time goes.

The slow tests are real ``nvtrain run`` jobs, and on the 2-core CI machine they are CPU-bound:
their time is the CPU their processes burn. This runs the fault-matrix job of the tests (4 gloo
ranks, FSDP2 demo, 60 steps, a save every 5) four ways, round-robin, N rounds:

- ``cold clean``: no faults, ``[job] warm_start = false`` (the default);
- ``cold faulty``: an exception, a hang and three SIGKILLs (three in-job restarts);
- ``warm clean`` and ``warm faulty``: the same with ``[job] warm_start = true``.

For each it reports the median wall time and the median CPU time (user + system) of everything
the run started (``RUSAGE_CHILDREN``: ``nvtrain run``, ft_launcher, the workers, the warm-start
server and its forks, all reaped). Every run must exit 0.

    python benchmarks/run_cost.py              # 3 rounds, markdown to stdout
    python benchmarks/run_cost.py -n 5 --ranks 2
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _lib  # benchmarks/_lib: this tree's src first on the path
from _lib import cli, stats
from _lib.procs import nvtrain_run_argv

sys.path.insert(0, str(_lib.REPO / "tests"))
from support.worker_helpers import demo_tables, write_policy  # noqa: E402  (the tests' policy)

FAULTS = [  # tests/worker/test_fault_matrix.py
    {"step": 12, "rank": 1, "kind": "exception"},
    {"step": 22, "rank": 2, "kind": "hang"},
    {"step": 31, "rank": 3, "kind": "sigkill"},
    {"step": 41, "rank": 0, "kind": "collective_sigkill"},
    {"step": 50, "rank": 1, "kind": "sigkill"},
]


def policy(path: Path, *, ranks: int, steps: int, warm: bool, faulty: bool) -> Path:
    """The tests' fault-matrix policy (``demo_tables``), cold or warm, with or without faults."""
    tables = demo_tables(path.parent / "ckpt", name="run-cost", ranks=ranks, steps=steps)
    tables["job"]["warm_start"] = warm
    faults = [f for f in FAULTS if f["rank"] < ranks] if faulty else []
    return write_policy(path, tables, faults)


def run_once(python: str, policy_path: Path, run_id: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of everything it started) of one ``nvtrain run``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(
        nvtrain_run_argv(policy_path, run_id, python=python),
        cwd=policy_path.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{run_id}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = cli.parser(__doc__, part="paragraph")
    parser.add_argument("-n", "--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    arms = [(warm, faulty) for warm in (False, True) for faulty in (False, True)]
    results: dict[tuple[bool, bool], list[tuple[float, float]]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="nvtrain-run-cost-") as tmp:
        root = Path(tmp)
        for round_ in range(args.rounds):
            for warm, faulty in arms:
                name = f"{'warm' if warm else 'cold'}-{'faulty' if faulty else 'clean'}-{round_}"
                folder = root / name
                folder.mkdir()
                path = policy(
                    folder / "policy.toml", ranks=args.ranks, steps=args.steps, warm=warm, faulty=faulty
                )
                wall, cpu = run_once(args.python, path, name)
                results[(warm, faulty)].append((wall, cpu))
                print(f"{name}: wall {wall:.1f} s, cpu {cpu:.1f} s", file=sys.stderr)
    print(f"{args.ranks} ranks, {args.steps} steps, {args.rounds} rounds (medians)\n")
    print("| run | wall s | CPU s |")
    print("|---|---:|---:|")
    for warm, faulty in arms:
        walls = [w for w, _ in results[(warm, faulty)]]
        cpus = [c for _, c in results[(warm, faulty)]]
        label = f"{'warm' if warm else 'cold'} {'faulty' if faulty else 'clean'}"
        print(f"| {label} | {stats.fmt(stats.median(walls), 1)} | {stats.fmt(stats.median(cpus), 1)} |")
    cold_cpu = stats.median(c for _, c in results[(False, True)])
    warm_cpu = stats.median(c for _, c in results[(True, True)])
    print(f"\nfaulty run, CPU warm / cold: {stats.fmt(stats.ratio(warm_cpu, cold_cpu))}")


if __name__ == "__main__":
    main()

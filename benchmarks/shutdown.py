"""How long ``nvtrain run`` takes to end once training is over: the run's ``shutdown`` in
``nvtrain report --json`` (the workers' last event to ``launcher_exit``), for the CPU demo
without its faults.

Each run is the built-in demo policy (or ``--policy FILE``) with its ``[[faults]]`` removed, its
checkpoints in a temporary folder, and ``[job] warm_start`` off or on. Besides the report's
figure it notes, from the events log and the moment the ``nvtrain run`` process was reaped
here: ``step->exit`` (the last logged step to the process's end, the final save included) and
``launcher_exit->exit`` (what ``nvtrain run`` does after its last event). A run must exit 0 with
its final step committed before ``launcher_exit``, or the benchmark stops.

Several trees can be compared side by side: each ``--src LABEL=DIR`` puts ``DIR`` (a ``src``
folder, e.g. of a git worktree of the old code) first on ``PYTHONPATH``; the runs alternate
between them, so every tree sees the same machine. The report is always this tree's.

    python benchmarks/shutdown.py                          # this tree, 5 runs cold, 5 warm
    python benchmarks/shutdown.py -n 7 --warm off --src old=/tmp/old-exit/src --src new=src
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _lib  # benchmarks/_lib: this tree's src first on the path
from _lib import cli, stats
from _lib.policy import load_tables
from _lib.policy import write_policy as write_tables
from _lib.procs import nvtrain_run_argv
from _lib.runs import report_json, src_env

DEMO = _lib.SRC / "nvtrain" / "config" / "demo.toml"


def write_policy(source: Path, folder: Path, *, warm: bool) -> Path:
    """``source`` without its faults, checkpoints under ``folder``, warm start as asked."""
    tables = load_tables(source)
    tables.pop("faults", None)
    tables.setdefault("job", {})["warm_start"] = warm
    tables.setdefault("checkpoint", {})["dir"] = str(folder / "ckpt")
    return write_tables(folder / "policy.toml", tables)


def run_once(python: str, src: str | None, policy: Path, run_id: str) -> dict[str, float]:
    """One ``nvtrain run``: its figures (seconds), checked as the module's docstring says."""
    done = subprocess.run(
        nvtrain_run_argv(policy, run_id, python=python),
        cwd=policy.parent,
        env=src_env(src),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    reaped = time.time()
    if done.returncode != 0:
        sys.exit(f"{run_id}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    run_dir = policy.parent / "ckpt" / run_id
    report = report_json(run_dir, env=src_env(_lib.SRC), timeout=120)
    if "error" in report:
        sys.exit(f"{run_id}: nvtrain report failed: {report['error']}")
    shutdown = report["time_s"]["shutdown"]
    events = [json.loads(line) for line in (run_dir / "events-node0.jsonl").read_text().splitlines() if line]
    last_step = max(e["step"] for e in events if e["event"] == "step")
    step_ts = max(e["ts"] for e in events if e["event"] == "step")
    exit_ts = next(e["ts"] for e in reversed(events) if e["event"] == "launcher_exit")
    commits = [e["ts"] for e in events if e["event"] == "checkpoint_committed" and e["step"] == last_step]
    if not commits or commits[0] > exit_ts or events[-1]["event"] != "launcher_exit":
        sys.exit(f"{run_id}: step {last_step} not committed before launcher_exit ({run_dir})")
    return {"shutdown": shutdown, "step->exit": reaped - step_ts, "launcher_exit->exit": reaped - exit_ts}


def main() -> None:
    parser = cli.parser(__doc__, part="paragraph")
    parser.add_argument("-n", "--runs", type=int, default=5, help="runs per tree and warm setting")
    parser.add_argument("--warm", choices=("off", "on", "both"), default="both")
    parser.add_argument("--policy", type=Path, default=DEMO, help="default: the built-in demo")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs nvtrain")
    parser.add_argument(
        "--src", action="append", metavar="LABEL=DIR", help="a tree to run (repeatable); default: installed"
    )
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args()
    trees = [(spec.partition("=")[0], spec.partition("=")[2] or None) for spec in args.src or ["installed="]]
    warms = {"off": [False], "on": [True], "both": [False, True]}[args.warm]
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="nvtrain-shutdown-") as tmp:
        for n in range(args.runs):
            for warm in warms:
                for label, src in trees:
                    arm = f"{label} {'warm' if warm else 'cold'}"
                    folder = Path(tmp) / f"{label}-{'warm' if warm else 'cold'}-{n}"
                    folder.mkdir()
                    policy = write_policy(args.policy, folder, warm=warm)
                    figures = run_once(args.python, src, policy, f"shutdown-{n}")
                    results.setdefault(arm, []).append(figures)
                    shown = ", ".join(f"{k} {v:.3f} s" for k, v in figures.items())
                    print(f"{arm} #{n}: {shown}", file=sys.stderr, flush=True)
    print(f"\n{args.runs} runs each (median, min-max), seconds\n")
    keys = ("shutdown", "step->exit", "launcher_exit->exit")
    print("| tree | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for arm, runs in results.items():
        cells = [stats.span([r[key] for r in runs], dash="-") for key in keys]
        print(f"| {arm} | " + " | ".join(cells) + " |")
    cli.write_json(args.json, results, newline=True)


if __name__ == "__main__":
    main()

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

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from nvtrain.findings import toml_value  # noqa: E402  (this tree's TOML writer)

DEMO = REPO / "src" / "nvtrain" / "config" / "demo.toml"


def write_policy(source: Path, folder: Path, *, warm: bool) -> Path:
    """``source`` without its faults, checkpoints under ``folder``, warm start as asked."""
    tables: dict[str, Any] = tomllib.loads(source.read_text(encoding="utf-8"))
    tables.pop("faults", None)
    tables.setdefault("job", {})["warm_start"] = warm
    tables.setdefault("checkpoint", {})["dir"] = str(folder / "ckpt")
    lines = []
    for name, keys in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value, limit=1 << 20)}" for key, value in keys.items()]
        lines.append("")
    path = folder / "policy.toml"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _env(src: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if src:
        rest = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
        env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), *rest])
    return env


def run_once(python: str, src: str | None, policy: Path, run_id: str) -> dict[str, float]:
    """One ``nvtrain run``: its figures (seconds), checked as the module's docstring says."""
    done = subprocess.run(
        [python, "-m", "nvtrain", "run", str(policy), "--run-id", run_id],
        cwd=policy.parent,
        env=_env(src),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    reaped = time.time()
    if done.returncode != 0:
        sys.exit(f"{run_id}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    run_dir = policy.parent / "ckpt" / run_id
    report = subprocess.run(
        [sys.executable, "-m", "nvtrain", "report", str(run_dir), "--json"],
        env=_env(str(REPO / "src")),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    shutdown = json.loads(report.stdout)["time_s"]["shutdown"]
    events = [json.loads(line) for line in (run_dir / "events-node0.jsonl").read_text().splitlines() if line]
    last_step = max(e["step"] for e in events if e["event"] == "step")
    step_ts = max(e["ts"] for e in events if e["event"] == "step")
    exit_ts = next(e["ts"] for e in reversed(events) if e["event"] == "launcher_exit")
    commits = [e["ts"] for e in events if e["event"] == "checkpoint_committed" and e["step"] == last_step]
    if not commits or commits[0] > exit_ts or events[-1]["event"] != "launcher_exit":
        sys.exit(f"{run_id}: step {last_step} not committed before launcher_exit ({run_dir})")
    return {"shutdown": shutdown, "step->exit": reaped - step_ts, "launcher_exit->exit": reaped - exit_ts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
        cells = []
        for key in keys:
            values = [r[key] for r in runs]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        print(f"| {arm} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

"""The README demo as a user runs it, with nothing set: two builds of nvtrain side by side.

Each arm runs ``python -m nvtrain run POLICY`` (the built-in demo policy by default: 2 ranks,
gloo, an exception at step 50 and a SIGKILL at step 90) with ``PYTHONPATH`` pointing at its own
``src`` (and, with ``--nvrx DIR``, an NVRx installed in DIR ahead of the venv's: how NVRx 0.7.0
runs on this machine's Python 3.11, see BENCHMARKS.md). Arms alternate, R runs each; from each
run's ``nvtrain report --json``: every incident's recovery time and phases, and the job's
start-up and shut-down. Medians per arm and the ratio new / old.

With --starter each arm runs instead the project that arm's ``nvtrain init`` writes, edited as a
new user on one CPU machine edits it (issue 37): 2 workers, ``backend = "gloo"``, a checkpoint
folder of the run's own, and its ``[[faults]]`` table uncommented for an exception on rank 1 at
step 700 (the starter's ``max_steps`` is 2000).

    git worktree add /tmp/nvtrain-base <base commit>
    python benchmarks/recovery/defaults.py --old /tmp/nvtrain-base/src --repeats 3 --json out.json
    python benchmarks/recovery/defaults.py --old /tmp/nvtrain-base/src --nvrx /tmp/nvrx07-site
    python benchmarks/recovery/defaults.py --old /tmp/nvtrain-base/src --starter
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib import SRC as NEW  # noqa: E402
from _lib import cli, procs, stats  # noqa: E402
from _lib.runs import report_json  # noqa: E402

STARTER_EDITS = {
    ("job", "nproc_per_node"): "2",
    ("job", "backend"): '"gloo"',
    ("faults", "step"): "700",
    ("faults", "rank"): "1",
    ("faults", "kind"): '"exception"',
}


def starter(work: Path, env: dict[str, str]) -> Path:
    """The project ``nvtrain init`` writes in ``work/project``, its policy edited (``STARTER_EDITS``,
    the checkpoints in ``work/ckpt``); returns the policy's path."""
    project = work / "project"
    subprocess.run([*procs.nvtrain_argv("init", str(project))], env=env, check=True, capture_output=True)
    edits = {**STARTER_EDITS, ("checkpoint", "dir"): json.dumps(str(work / "ckpt"))}
    lines = (project / "policy.toml").read_text(encoding="utf-8").splitlines()
    table, done = "", set()
    for i, line in enumerate(lines):
        if line.strip() in ("[[faults]]", "# [[faults]]"):
            lines[i], table = "[[faults]]", "faults"
        elif line.startswith("[") and line.endswith("]"):
            table = line.strip("[]")
        elif (key := line.removeprefix("# ").partition(" = ")[0]) and (table, key) in edits:
            lines[i] = f"{key} = {edits[table, key]}"
            done.add((table, key))
    assert done == set(edits), f"not in the starter: {set(edits) - done}"
    (project / "policy.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return project / "policy.toml"


def run_once(
    src: Path,
    policy: Path | None,
    nvrx: str | None,
    timeout: float,
    *,
    use_starter: bool = False,
    keep: Path | None = None,
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="nvtrain-defaults-"))
    path = [str(src), *([nvrx] if nvrx else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "TMPDIR": str(work)}
    argv = procs.nvtrain_argv("run", "--run-id", "defaults")
    cwd = work
    if use_starter:
        argv.append(str(starter(work, env)))
        cwd = work / "project"  # (its `script = "train.py"` is found there, as torchrun would)
    elif policy is not None:
        text = policy.read_text(encoding="utf-8").replace("/tmp/nvtrain-demo/checkpoints", str(work / "ckpt"))
        (work / "policy.toml").write_text(text, encoding="utf-8")
        argv.append(str(work / "policy.toml"))
    else:  # the built-in demo: its checkpoints go to /tmp/nvtrain-demo/checkpoints/defaults
        shutil.rmtree("/tmp/nvtrain-demo/checkpoints/defaults", ignore_errors=True)
    started = time.monotonic()
    done = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    wall = time.monotonic() - started
    run_dir = (work / "ckpt" if policy or use_starter else Path("/tmp/nvtrain-demo/checkpoints")) / "defaults"
    data = report_json(run_dir, env={**os.environ, "PYTHONPATH": str(NEW)}, timeout=120)
    if keep is not None:  # the run's events and logs (if it got that far), and what the launcher printed
        if run_dir.is_dir():
            shutil.copytree(run_dir, keep, dirs_exist_ok=True)
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "launcher.out").write_text(done.stdout + done.stderr, encoding="utf-8")
    shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = {"exit_code": done.returncode, "wall_s": round(wall, 3)}
    if "error" in data:
        result["error"] = data["error"] or done.stderr[-2000:]
        return result
    result["time_s"] = data["time_s"]
    result["goodput"] = data["goodput"]
    result["incidents"] = [
        {
            "cause": i["cause"],
            "layer": i["layer"],
            "recovery_s": i["recovery_s"],
            "phases_s": i["phases_s"],
            "restore_source": i.get("restore_source"),
            "rollback_steps": i.get("rollback_steps"),
            "rollback_s": i.get("rollback_s"),
        }
        for i in data["incidents"]
    ]
    return result


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for arm, results in runs.items():
        row: dict[str, Any] = {}
        causes = sorted({i["cause"] for r in results for i in r.get("incidents", [])})
        for cause in causes:
            incidents = [i for r in results for i in r.get("incidents", []) if i["cause"] == cause]
            row[cause] = {"recovery_s": stats.median([i["recovery_s"] for i in incidents], 3)}
            for lost in ("rollback_steps", "rollback_s"):  # the steps done again after it
                row[cause][lost] = stats.median([i.get(lost) for i in incidents], 3)
            for phase in ("detection", "teardown", "rendezvous", "start", "restore", "first_step"):
                values = [i["phases_s"][phase] for i in incidents if i["phases_s"].get(phase) is not None]
                row[cause][phase] = stats.median(values, 3)
        for part in ("startup", "shutdown", "total"):
            row[part] = stats.median(
                [r["time_s"][part] for r in results if "time_s" in r and r["time_s"].get(part)], 3
            )
        goodput = [r["goodput"]["training"] for r in results if "goodput" in r]
        row["training_goodput"] = stats.median(goodput, 3)
        row["exit_codes"] = [r["exit_code"] for r in results]
        table[arm] = row
    return table


def main() -> None:
    parser = cli.parser(__doc__, part="all")
    parser.add_argument("--old", type=Path, required=True, help="the other build's src folder")
    parser.add_argument("--policy", type=Path, help="a policy file (default: the built-in demo)")
    parser.add_argument("--nvrx", help="a folder with another NVRx, put ahead of the venv's")
    parser.add_argument("--starter", action="store_true", help="run the edited `nvtrain init` project")
    parser.add_argument("--keep", type=Path, help="keep each run's folder in KEEP/<arm>-<n>")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    arms = {"old": args.old.resolve(), "new": NEW}
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    for rep in range(args.repeats):
        order = list(arms) if rep % 2 == 0 else list(reversed(arms))
        for arm in order:
            keep = None if args.keep is None else args.keep / f"{arm}-{rep + 1}"
            result = run_once(
                arms[arm], args.policy, args.nvrx, args.timeout, use_starter=args.starter, keep=keep
            )
            runs[arm].append(result)
            print(json.dumps({"arm": arm, **result}), flush=True)
    table = summarize(runs)
    print(json.dumps(table, indent=1))
    cli.write_json(args.json, {"args": cli.args_record(args), "runs": runs, "summary": table}, indent=1)


if __name__ == "__main__":
    main()

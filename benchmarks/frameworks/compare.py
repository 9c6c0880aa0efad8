"""SIGKILL of rank 0 to the next training step: torchrun against ``nvtrain run`` as a torchrun
user runs it (the default path: no policy, no nvtrain import in the script), side by side.

For each script (``ddp_train.py``, ``hf_train.py``, ``lightning_train.py``) and each arm, one
run = the script on N ranks with ``--max-restarts 1``, rank 0 SIGKILLing itself once at step K;
recovery = the first step printed after the fault minus the fault's time (both ``time.time()``
on rank 0, fault.py). Arms alternate, R runs each; medians and the ratio to torchrun.

    python benchmarks/frameworks/compare.py --scripts ddp,hf,lightning --repeats 3 --json out.json

Arms: ``torchrun`` (``python -m torch.distributed.run --standalone``, its defaults: monitor
interval 0.1 s), ``nvtrain`` (``python -m nvtrain run``, its defaults: warm start) and, with
``--cold``, ``nvtrain-cold`` (``--no-warm-start``).
Needs transformers and lightning for the hf and lightning scripts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib import cli, procs, stats  # noqa: E402

HERE = Path(__file__).resolve().parent
SCRIPTS = {"ddp": "ddp_train.py", "hf": "hf_train.py", "lightning": "lightning_train.py"}
OUT_FLAG = {"ddp": "--ckpt", "hf": "--out", "lightning": "--out"}
LINE = re.compile(r"BENCH (STEP|FAULT|MAIN) (\d+) (\d+\.\d+)")


def argv_for(arm: str, script: Path, nproc: int, args: list[str]) -> list[str]:
    if arm == "torchrun":
        return procs.torchrun_argv(nproc, "--max-restarts=1", str(script), *args, standalone=True)
    # The "nvtrain" arm is the default path (warm); "nvtrain-cold" opts out.
    policy = ["--no-warm-start"] if arm == "nvtrain-cold" else []
    return procs.nvtrain_argv(
        "run", *policy, f"--nproc-per-node={nproc}", "--max-restarts=1", str(script), *args
    )


def one_run(
    arm: str, name: str, nproc: int, steps: int, fault: int, timeout: float, keep: Path | None
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"fw-{name}-{arm}-"))
    args = ["--steps", str(steps), OUT_FLAG[name], str(work / "out")]
    env = {
        **os.environ,
        "BENCH_FAULT_STEP": str(fault),
        "BENCH_FAULT_MARK": str(work / "fired"),
        "PYTHONUNBUFFERED": "1",
    }
    env["TMPDIR"] = str(work)
    # torchrun's shared rendezvous store breaks a restarted gloo group here (benchmarks/recovery/
    # sigkill.py says why); every arm gets the same setting.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    finished = procs.run_job(
        argv_for(arm, HERE / SCRIPTS[name], nproc, args), work / "output.txt", timeout, env=env, cwd=work
    )
    procs.kill_group(finished.pid)  # what is left of the launcher's group
    started, wall = finished.start, time.time() - finished.start
    out = (work / "output.txt").read_text(encoding="utf-8", errors="replace")
    fault_t = None
    steps_after: list[tuple[int, float]] = []
    first_step = main_after = None
    for kind, step, stamp in LINE.findall(out):
        t = float(stamp)
        if kind == "FAULT":
            fault_t = t
        elif kind == "MAIN":
            if fault_t is not None and main_after is None:
                main_after = t
            continue
        elif first_step is None:
            first_step = t
        if kind == "STEP" and fault_t is not None and t > fault_t:
            steps_after.append((int(step), t))
    result: dict[str, Any] = {
        "arm": arm,
        "script": name,
        "exit_code": finished.exit_code,
        "wall_s": round(wall, 3),
        "first_step_s": None if first_step is None else round(first_step - started, 3),
        "recovery_s": None if fault_t is None or not steps_after else round(steps_after[0][1] - fault_t, 3),
        "resumed_at": steps_after[0][0] if steps_after else None,
        # the launcher's part: fault -> the new rank 0 runs the script's main()
        "to_main_s": None if fault_t is None or main_after is None else round(main_after - fault_t, 3),
        "warm_off": [line for line in out.splitlines() if "warm start: off" in line][:1],
    }
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{name}-{arm}-{int(started)}.out").write_text(out, encoding="utf-8")
    shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    parser = cli.parser(__doc__, part="all")
    parser.add_argument("--scripts", default="ddp,hf,lightning")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fault-step", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="also nvtrain with --no-warm-start")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="keep each run's output here")
    args = parser.parse_args()
    arms = ["torchrun", "nvtrain", *(["nvtrain-cold"] if args.cold else [])]
    runs = []
    for name in args.scripts.split(","):
        for rep in range(args.repeats):
            for arm in arms if rep % 2 == 0 else reversed(arms):
                result = one_run(arm, name, args.nproc, args.steps, args.fault_step, args.timeout, args.keep)
                print(json.dumps(result), flush=True)
                runs.append(result)
    summary: dict[str, Any] = {}
    for name in args.scripts.split(","):
        base = None
        for arm in arms:
            values = [
                r["recovery_s"]
                for r in runs
                if r["script"] == name and r["arm"] == arm and r["recovery_s"] is not None
            ]
            starts = [
                r["first_step_s"]
                for r in runs
                if r["script"] == name and r["arm"] == arm and r["first_step_s"] is not None
            ]
            median = stats.median(values)
            if arm == "torchrun":
                base = median
            summary[f"{name}/{arm}"] = {
                "recovery_s": values,
                "median_s": median,
                "ratio_to_torchrun": stats.ratio(median, base, 2),
                "first_step_median_s": stats.median(starts),
            }
    for key, row in summary.items():
        print(
            f"{key:24s} recovery median {row['median_s']} s  x{row['ratio_to_torchrun']}  "
            f"{row['recovery_s']}  first step {row['first_step_median_s']} s"
        )
    options = vars(args) | {"json": str(args.json), "keep": str(args.keep)}
    cli.write_json(args.json, {"args": options, "runs": runs, "summary": summary}, indent=1)


if __name__ == "__main__":
    main()

"""Each framework's script under torchrun (its own checkpoints) against the same script with
nvtrain's integration under ``nvtrain run``, side by side: recovery per fault kind, the time a
save blocks training, goodput.

One run per (framework, arm): ``--steps`` steps on ``--nproc`` ranks, rank 0 failing three
times: an exception, a SIGKILL, a hang (``--faults``, in that order). Arms:

- ``torchrun``: ``python -m torch.distributed.run --standalone --max-restarts 3``,
  ``bench_train.py --mode plain``: the framework saves every ``--save-every`` steps
  (synchronously) and a restart resumes from its newest checkpoint. torchrun has no hang
  detection: a hung rank holds the job until its collectives time out (the framework's
  default, 30 minutes), so the run is stopped ``--hang-wait`` seconds after the hang and the
  hang counts as not recovered.
- ``nvtrain``: ``nvtrain run POLICY`` with ``bench_train.py --mode nvtrain``: async saves every
  ``--save-every`` steps with the host copy, warm start, in-process restart (``--soft-timeout``).

Per run: recovery of each fault = the first step rank 0 completes after the fault minus the
fault's time (``time.time()`` on rank 0 both); blocked per save = the step interval that
contains a save less the median interval (and, for nvtrain, the events' ``blocked_s``);
goodput = final step x median step time / wall time from launch to exit.

    python benchmarks/integrations/compare.py --frameworks hf,lightning,accelerate --nproc 8 \\
        --json integrations-h200.json --keep /tmp/integrations-runs

Each nvtrain run's incidents (cause, layer, recovery, phases) come from ``nvtrain report --json``;
``--keep`` also keeps its events log and launcher log. A run's folder (its checkpoints) is removed
once it is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib import cli, procs  # noqa: E402
from _lib.runs import report_json, run_events  # noqa: E402

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "bench_train.py"
STEP = re.compile(r"^BENCH STEP (\d+) (\d+\.\d+)$", re.MULTILINE)
FAULT = re.compile(r"^BENCH FAULT (\w+) (\d+) (\d+\.\d+)$", re.MULTILINE)
FINAL = re.compile(r"^BENCH FINAL (\S+)$", re.MULTILINE)


def policy_text(
    args: argparse.Namespace,
    framework: str,
    work: Path,
    faults: list[tuple[str, int]],
    extra: tuple[str, ...] = (),
) -> str:
    model = script_args(args, framework, "nvtrain", work, extra)
    nccl = args.backend == "nccl"
    soft = args.soft_timeout
    lines = [
        "[job]",
        f'name = "bench-{framework}"',
        f"script = {json.dumps(str(SCRIPT))}",
        f"args = {json.dumps(model)}",
        f"nproc_per_node = {args.nproc}",
        f"max_steps = {args.steps}",
        f'backend = "{args.backend}"',
        # NCCL: longer than the hard timeout (NVRx aborts a hung collective first); gloo: shorter
        # than the soft timeout (the timeout frees the peers), as `nvtrain validate` requires.
        f'collective_timeout = "{4 * soft if nccl else soft / 2}s"',
        "warm_start = true",
        "",
        "[heartbeat]",
        f'timeout = "{6 * soft}s"',
        'initial_timeout = "600s"',
        "",
        "[restart.in_process]",
        "enabled = true",
        f'soft_timeout = "{soft}s"',
        f'hard_timeout = "{2 * soft}s"',
        "",
        "[restart.in_job]",
        "max_restarts = 3",
        "",
        "[checkpoint]",
        f"dir = {json.dumps(str(work / 'ckpt'))}",
        f"interval = {args.save_every}",
        "async = true",
        "keep = 2",
        "",
    ]
    for kind, step in faults:
        lines += ["[[faults]]", f'kind = "{kind}"', f"step = {step}", "rank = 0", ""]
    return "\n".join(lines)


def script_args(
    args: argparse.Namespace, framework: str, mode: str, work: Path, extra: tuple[str, ...] = ()
) -> list[str]:
    return [
        "--framework",
        framework,
        "--mode",
        mode,
        "--out",
        str(work / "out"),
        "--steps",
        str(args.steps),
        "--save-every",
        str(args.save_every),
        "--layers",
        str(args.layers),
        "--width",
        str(args.width),
        "--heads",
        str(args.heads),
        "--seq",
        str(args.seq),
        "--batch",
        str(args.batch),
        *extra,
    ]


def parse_faults(text: str) -> list[tuple[str, int]]:
    faults = []
    for entry in filter(None, text.split(",")):
        kind, _, step = entry.partition(":")
        faults.append((kind, int(step)))
    return faults


def one_run(
    args: argparse.Namespace,
    framework: str,
    arm: str,
    *,
    faults_text: str | None = None,
    extra: tuple[str, ...] = (),
    env_extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One run of ``framework`` in ``arm``; ``faults_text`` (default ``--faults``; "" for none),
    ``extra`` arguments for ``bench_train.py`` and ``env_extra`` for its environment."""
    work = Path(tempfile.mkdtemp(prefix=f"integ-{framework}-{arm}-"))
    faults_text = args.faults if faults_text is None else faults_text
    faults = parse_faults(faults_text)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(work), **(env_extra or {})}
    if arm == "torchrun":
        (work / "marks").mkdir()
        env |= {"BENCH_FAULTS": faults_text, "BENCH_FAULT_DIR": str(work / "marks")}
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as benchmarks/frameworks/compare.py
        plain = script_args(args, framework, "plain", work, extra)
        argv = procs.torchrun_argv(args.nproc, "--max-restarts=3", str(SCRIPT), *plain, standalone=True)
    else:
        policy = work / "policy.toml"
        policy.write_text(policy_text(args, framework, work, faults, extra), encoding="utf-8")
        argv = procs.nvtrain_run_argv(policy, f"bench-{framework}")
    started = time.time()
    out_path = work / "output.txt"
    with out_path.open("w") as out:
        proc = subprocess.Popen(
            argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        stopped, stop_t = False, 0.0
        while proc.poll() is None:
            time.sleep(0.5)
            text = out_path.read_text(errors="replace")
            hung = [float(t) for k, s, t in FAULT.findall(text) if k == "hang"]
            overdue = time.time() - started > args.timeout
            if (arm == "torchrun" and hung and time.time() - hung[0] > args.hang_wait) or overdue:
                stop_t = time.time()  # the run's end for goodput: not the time it takes to stop
                procs.stop_group(proc, grace=30)
                stopped = True
    ended = stop_t if stopped else time.time()
    text = out_path.read_text(errors="replace")
    steps = [(int(s), float(t)) for s, t in STEP.findall(text)]
    fired: list[tuple[str, int, float]] = [(k, int(s), float(t)) for k, s, t in FAULT.findall(text)]
    blocked_events: list[float] = []
    if arm == "nvtrain":
        fired, blocked_events = nvtrain_events(work / "ckpt" / f"bench-{framework}")
    result = summarise(args, steps, fired, started, ended)
    result |= {"framework": framework, "arm": arm, "exit_code": proc.returncode, "stopped": stopped}
    if final := FINAL.findall(text):
        result["final_loss"] = float(final[-1])
    if blocked_events:
        result["blocked_s_events_median"] = round(statistics.median(blocked_events), 4)
    if arm == "nvtrain":
        report = report_json(work / "ckpt" / f"bench-{framework}", timeout=120)
        keys = ("cause", "layer", "recovery_s", "phases_s")
        result["incidents"] = [{k: i.get(k) for k in keys} for i in report.get("incidents", [])]
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        name = f"{framework}-{arm}-{int(started)}"
        (args.keep / f"{name}.out").write_text(text, encoding="utf-8")
        if arm == "nvtrain":  # the run's logs: what nvtrain report and NVRx's own lines say
            run_dir = work / "ckpt" / f"bench-{framework}"
            for log in [*run_dir.glob("events-node*.jsonl"), *run_dir.glob("launcher-node*.log")]:
                shutil.copyfile(log, args.keep / f"{name}.{log.name}")
    shutil.rmtree(work, ignore_errors=True)  # its checkpoints: GBs per run
    return result


def nvtrain_events(run_dir: Path) -> tuple[list[tuple[str, int, float]], list[float]]:
    """Rank 0's injected faults and save blocking times, from the run's events log."""
    events = [e.as_dict() for e in run_events(run_dir)]
    fired = [
        (str(e["kind"]), int(e["step"]), float(e["ts"]))
        for e in events
        if e["event"] == "fault_injected" and e.get("rank") == 0
    ]
    blocked = [
        float(e["blocked_s"]) for e in events if e["event"] == "checkpoint_staged" and e.get("rank") == 0
    ]
    return sorted(fired, key=lambda f: f[2]), blocked


def summarise(
    args: argparse.Namespace,
    steps: list[tuple[int, float]],
    fired: list[tuple[str, int, float]],
    started: float,
    ended: float,
) -> dict[str, Any]:
    recovery: dict[str, float | None] = {}
    for kind, _step, t in fired:
        after = [s_t for s_t in steps if s_t[1] > t]
        recovery[kind] = round(after[0][1] - t, 3) if after else None
    # Step intervals of the first pass (no replayed step, no fault in between).
    first: dict[int, float] = {}
    for step, t in steps:
        first.setdefault(step, t)
    fault_steps = {s for _, s, _ in fired}
    intervals = {s: first[s + 1] - first[s] for s in first if s + 1 in first and first[s + 1] > first[s]}
    plain = [v for s, v in intervals.items() if s % args.save_every and s not in fault_steps and s > 2]
    median_step = statistics.median(plain) if plain else None
    saves = [
        intervals[s] - median_step
        for s in intervals
        if median_step is not None and s % args.save_every == 0 and s not in fault_steps
    ]
    final = max((s for s, _ in steps), default=0)
    wall = ended - started
    return {
        "recovery_s": recovery,
        "not_recovered": [k for k, v in recovery.items() if v is None],
        "median_step_s": None if median_step is None else round(median_step, 4),
        "blocked_s_per_save": [round(v, 4) for v in saves],
        "blocked_s_median": round(statistics.median(saves), 4) if saves else None,
        "final_step": final,
        "wall_s": round(wall, 2),
        "goodput": None if median_step is None else round(final * median_step / wall, 3),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a run, shared with ``tolerance.py``."""
    parser.add_argument("--frameworks", default="hf,lightning,accelerate")
    parser.add_argument("--arms", default="torchrun,nvtrain")
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--faults", default="exception:30,sigkill:65,hang:100")
    parser.add_argument(
        "--soft-timeout", type=float, default=10.0, help="nvtrain arm's in-process soft timeout"
    )
    parser.add_argument(
        "--hang-wait", type=float, default=90.0, help="torchrun arm: stop this long after the hang"
    )
    parser.add_argument("--timeout", type=float, default=540.0, help="either arm: stop after this long")
    parser.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="keep each run's output here")
    parser.add_argument(
        "--build-on-device", action="store_true", help="each script builds its model on its GPU (both arms)"
    )


def main() -> None:
    parser = cli.parser(__doc__, part="all")
    add_arguments(parser)
    args = parser.parse_args()
    runs = []
    extra = ("--build-on-device",) if args.build_on_device else ()
    for framework in args.frameworks.split(","):
        for arm in args.arms.split(","):
            result = one_run(args, framework, arm, extra=extra)
            print(json.dumps(result), flush=True)
            runs.append(result)
    for r in runs:
        print(
            f"{r['framework']:10s} {r['arm']:8s} recovery {r['recovery_s']}  blocked/save median "
            f"{r['blocked_s_median']} s (events {r.get('blocked_s_events_median')})  "
            f"goodput {r['goodput']}  steps {r['final_step']}/{args.steps} in {r['wall_s']} s"
        )
        for incident in r.get("incidents", []):
            cause, layer = incident["cause"], incident["layer"]
            print(f"    {cause} ({layer}): {incident['recovery_s']} s, {incident['phases_s']}")
    options = vars(args) | {"json": str(args.json), "keep": str(args.keep)}
    cli.write_json(args.json, {"args": options, "runs": runs}, indent=1)


if __name__ == "__main__":
    main()

"""The side-by-side recovery benchmark: the same job and fault schedule under three recovery arms.

Arms (each with async and with sync checkpoints):

  pod         what Kubernetes alone does: plain torchrun without restarts; when any worker fails,
              every process of the node exits and the driver starts torchrun again from scratch
              (no scheduling or image-pull delay is added: a lower bound for a pod restart);
              a liveness probe restarts the pod when the events log has not grown for
              --liveness seconds (the heartbeat timeout by default): without it, a hang that no
              peer's collective times out on (one rank, a hang outside collectives) would
              never end
  in-job      `nvtrain run` with in-process restart off: ft_launcher restarts the workers
  in-process  `nvtrain run` with in-process restart on (soft faults), ft_launcher for the rest

Every arm runs the demo training script (FSDP2, gloo, 2 ranks) with the worker library, the same
deterministic faults (exception, hang, SIGKILL, exception, SIGKILL by default) and checkpoints every
--interval steps; the figures come from `nvtrain report --json` on each run's events log.

    python benchmarks/recovery/side_by_side.py --out /tmp/sbs --json /tmp/sbs.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib import cli, procs, runs, stats  # noqa: E402
from _lib.policy import fault_tables  # noqa: E402
from _lib.procs import free_port  # noqa: E402

from nvtrain.launcher.process import become_subreaper, kill_all  # noqa: E402

KINDS = ["exception", "hang", "sigkill", "exception", "sigkill"]
LIVENESS: list[float] = [0.0]  # --liveness, seconds; 0: the policy's heartbeat timeout


def policy_text(arm: str, mode: str, args: argparse.Namespace, ckpt: Path, port: int) -> str:
    steps, faults = args.steps, []
    gap = steps // (args.faults + 1)
    for i in range(args.faults):
        # mid-interval, so each fault loses about half an interval of work
        offset = args.interval // 2 if args.fault_offset is None else args.fault_offset
        kinds = args.kinds.split(",")
        faults.append((gap * (i + 1) + offset, (i + 1) % args.nproc, kinds[i % len(kinds)]))
    base, _, window = arm.partition("@")  # "in-process@100ms": that [restart.in_process] failure_window
    in_process = "true" if base == "in-process" else "false"
    window_line = f'failure_window = "{window}"\n' if window else ""
    extra = "".join(f', "{a}"' for a in args.demo_args.split())
    return f"""[job]
name = "sbs-{base}-{mode}"
module = "nvtrain.demo"
args = ["--steps", "{steps}", "--step-time", "{args.step_time}", "--log-every", "10"{extra}]
nproc_per_node = {args.nproc}
backend = "{args.backend}"
collective_timeout = "{args.collective_timeout}"

[rendezvous]
port = {port}

[heartbeat]
initial_timeout = "90s"
timeout = "{args.heartbeat_timeout}"
monitor_interval = "1s"

[restart]
escalate_after = 20

[restart.in_process]
enabled = {in_process}
soft_timeout = "{args.soft_timeout}"
hard_timeout = "{args.hard_timeout}"
max_attempts = 10
{window_line}
[restart.in_job]
max_restarts = 10

[checkpoint]
dir = "{ckpt}"
interval = {args.interval}
keep = 2
async = {"true" if mode == "async" else "false"}
finish_in_flight = {args.finish_in_flight}

""" + fault_tables(faults)


def run_nvtrain(policy: Path, run_id: str, log: Path, timeout: float) -> int:
    return procs.run_job(procs.nvtrain_run_argv(policy, run_id), log, timeout).exit_code


def run_pod_restarts(policy_path: Path, run_id: str, log: Path, timeout: float) -> int:
    """torchrun without restarts, started again from scratch after every failure."""
    from nvtrain.config.validation import load_policy
    from nvtrain.events import EventLog
    from nvtrain.events.records import LauncherExit, LauncherStart, RestartBegin, WorkerFailed

    policy = load_policy(policy_path)
    run_dir = Path(policy.checkpoint.dir) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = run_dir.parent / f"{run_id}.policy.json"
    resolved.write_text(policy.model_dump_json(by_alias=True))
    events = EventLog(run_dir / "events.jsonl", node=0, run_id=run_id, source="launcher")
    env = {
        **os.environ,
        "NVTRAIN_POLICY": str(resolved),
        "NVTRAIN_RUN_ID": run_id,
        "NVTRAIN_EVENTS": str(run_dir / "events.jsonl"),
        "TORCH_CPP_LOG_LEVEL": "ERROR",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    deadline = time.monotonic() + timeout
    liveness = LIVENESS[0] or policy.heartbeat.timeout
    events.emit(LauncherStart(extra={"arm": "pod"}))
    restarts = 0
    with log.open("w") as out:
        while True:
            argv = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc-per-node={policy.job.nproc_per_node}",
                "--max-restarts=0",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}",
                "-m",
                "nvtrain.demo",
                *policy.job.args,
            ]
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            code = _wait_alive(proc, events, deadline, liveness, policy.heartbeat.initial_timeout)
            procs.kill_group(proc.pid)  # the whole "pod" goes, nothing survives:
            kill_all(timeout=0.0)  # also the workers torchrun started in sessions of their own
            if code == 0 or time.monotonic() >= deadline or restarts >= policy.restart.in_job.max_restarts:
                events.emit(LauncherExit(exit_code=code, cause="pod-restart baseline ended"))
                return code
            restarts += 1
            events.emit(WorkerFailed(worker_pid=proc.pid, exit_code=code))
            events.emit(RestartBegin(layer="pod"))


def _wait_alive(
    proc: subprocess.Popen[bytes], events: Any, deadline: float, liveness: float, initial: float
) -> int:
    """Wait for the "pod" to end; kill it when the events log stops growing (a liveness probe
    on the workers' progress: ``initial`` seconds after the start, then ``liveness``)."""
    from nvtrain.events.records import HangDetected

    started = time.time()
    while True:
        code = proc.poll()
        if code is not None:
            return code
        if time.monotonic() >= deadline:
            procs.kill_group(proc.pid)
            return -9
        try:
            touched = events.path.stat().st_mtime
        except FileNotFoundError:
            touched = started
        quiet = time.time() - max(touched, started)
        if quiet > (liveness if touched > started else initial):
            events.emit(HangDetected(extra={"detector": "liveness probe", "quiet_s": round(quiet, 2)}))
            procs.kill_group(proc.pid)
            return -9
        time.sleep(0.2)


def report(run_dir: Path) -> dict[str, Any]:
    return runs.report_json(run_dir)


def table(results: dict[str, Any]) -> str:
    """One markdown row per run, and each arm's median recovery as a ratio to the pod arm's."""
    rows = [
        "| arm | checkpoints | exit | wall (s) | incidents | recovery median / p95 / max (s) "
        "| training goodput | infrastructure goodput | steps rolled back |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    medians: dict[str, float] = {}
    pooled: dict[str, list[float]] = {}
    for key, run in results["runs"].items():
        arm, mode = key.split("#")[0].split("/")
        rep = run["report"]
        if "error" in rep:
            rows.append(
                f"| {arm} | {mode} | {run['exit_code']} | {run['wall_s']} | report failed: "
                f"{rep['error'][:80]} | | | | |"
            )
            continue
        rec = [i["recovery_s"] for i in rep["incidents"] if i.get("recovery_s") is not None]
        d = stats.dist(rec)
        pooled.setdefault(f"{arm}/{mode}", []).extend(rec)
        layers = ", ".join(f"{n} {v}" for n, v in sorted(rep["restarts"]["by_layer"].items()))
        rows.append(
            f"| {arm} | {mode} | {run['exit_code']} | {run['wall_s']:.1f} | {len(rep['incidents'])} "
            f"({layers}) | {d.get('median', 0):.2f} / {d.get('p95', 0):.2f} / {d.get('max', 0):.2f} "
            f"| {rep['goodput']['training']:.1%} | {rep['goodput']['infrastructure']:.1%} "
            f"| {rep['steps']['rolled_back']} |"
        )
    medians = {key: statistics.median(values) for key, values in pooled.items() if values}
    ratios = []
    for key, median in medians.items():
        arm, mode = key.split("/")
        first = next(k for k in medians if k.endswith(f"/{mode}"))
        ratios.append(f"{arm}/{mode}: median {median:.2f} s, x{median / medians[first]:.2f}")
    rows.append("")
    rows.append(
        "median recovery of every incident of each arm (repeats pooled), and its ratio to the "
        "first arm's (same checkpoint mode): " + ("; ".join(ratios) or "n/a")
    )
    return "\n".join(rows)


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--faults", type=int, default=5)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--arms", default="pod,in-job,in-process")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument(
        "--collective-timeout",
        default=None,
        help='default: "3s" with gloo (below the soft timeout: gloo cannot abort), "12s" with NCCL '
        "(above it: NCCL collectives are aborted by the in-process layer)",
    )
    parser.add_argument("--soft-timeout", default="4s")
    parser.add_argument("--hard-timeout", default="10s")
    parser.add_argument("--heartbeat-timeout", default="15s")
    parser.add_argument(
        "--liveness",
        type=float,
        default=0.0,
        help="pod arm: seconds without a new event before the liveness probe restarts the pod "
        "(default: the heartbeat timeout)",
    )
    parser.add_argument("--demo-args", default="", help="extra arguments for the demo, e.g. '--width 4096'")
    parser.add_argument("--modes", default="async,sync")
    parser.add_argument("--kinds", default=",".join(KINDS), help="fault kinds, in turn")
    parser.add_argument(
        "--fault-offset",
        type=int,
        default=None,
        help="steps after a save at which each fault fires (default: half an interval; "
        "a multiple of --interval fires right after a save started)",
    )
    parser.add_argument("--finish-in-flight", default="true", choices=["true", "false"])
    parser.add_argument("--timeout", type=float, default=400.0, help="per run, seconds")
    parser.add_argument("--repeats", type=int, default=1, help="runs per arm, arms alternating")
    parser.add_argument("--out", type=Path, default=Path("/tmp/nvtrain-side-by-side"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--summarize",
        type=Path,
        default=None,
        help="only re-run `nvtrain report` on the runs of this results file and print the table",
    )
    args = parser.parse_args()
    LIVENESS[0] = args.liveness
    if args.collective_timeout is None:
        args.collective_timeout = "3s" if args.backend == "gloo" else "12s"
    if args.summarize:
        results = json.loads(args.summarize.read_text())
        for run in results["runs"].values():
            run["report"] = report(Path(run["run_dir"]))
        args.summarize.write_text(json.dumps(results, indent=2))
        print(table(results))
        return
    become_subreaper()  # orphans of a killed "pod" become ours, so kill_all reaches them
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "started": cli.utc_now(),
        "args": cli.args_record(args),
        "runs": {},
    }
    for repeat in range(args.repeats):
        for mode in args.modes.split(","):
            for arm in args.arms.split(","):
                key = f"{arm}/{mode}" + (f"#{repeat + 1}" if args.repeats > 1 else "")
                name = arm.replace("@", "-")
                run_id = f"{name}-{mode}-{repeat}-{int(time.time())}"
                ckpt = args.out / "ckpt"
                policy = args.out / f"{name}-{mode}-{repeat}.toml"
                policy.write_text(policy_text(arm, mode, args, ckpt, free_port()))
                log = args.out / f"{name}-{mode}-{repeat}.log"
                t0 = time.monotonic()
                runner = run_pod_restarts if arm == "pod" else run_nvtrain
                code = runner(policy, run_id, log, args.timeout)
                wall = time.monotonic() - t0
                # torchrun starts each worker in a session of its own, so a killed "pod" can leave a
                # hung worker behind (holding its GPU memory); nothing may outlive its arm
                leftovers = kill_all(timeout=0.0)
                rep = report(ckpt / run_id)
                results["runs"][key] = {
                    "exit_code": code,
                    "wall_s": round(wall, 2),
                    "leftover_processes": len(leftovers),
                    "run_dir": str(ckpt / run_id),
                    "report": rep,
                }
                print(f"{key}: exit {code}, {wall:.1f} s, {len(leftovers)} leftover processes", flush=True)
                # after every run, so a run cut short still leaves its results
                cli.write_json(args.json, results)
    cli.write_json(args.json, results)
    print(
        json.dumps({k: {"exit": v["exit_code"], "wall_s": v["wall_s"]} for k, v in results["runs"].items()})
    )


if __name__ == "__main__":
    main()

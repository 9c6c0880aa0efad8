"""Hard faults restored from the host copy in /dev/shm against from storage, side by side.

Two arms, alternating, R runs each, the same demo job and SIGKILL schedule (`nvtrain run`,
in-process restart off, so every fault is an in-job restart):

  memory    `[checkpoint] memory_dir = "/dev/shm"` (the default): a replaced worker restores the
            staged copy that outlived its predecessor
  storage   `memory_dir = ""`: the copy dies with the worker; the restore reads the checkpoint
  warm      as memory, and `[job] warm_start = true`: the replacement workers are forked from an
            interpreter that has torch and the script's imports loaded already

Per incident, from `nvtrain report --json`: SIGKILL -> next completed step and its phases
(detection, teardown, rendezvous, start, restore, first step: "restore" runs from the worker's
start to its checkpoint_restored, so it holds the process group and the model's construction
too) and where the restore read from; the loads alone are checkpoint_restored's `seconds`.
Per run, from the events log: the blocked time of the first async save against the later ones
(the buffers are pinned before the first save), and the background write rate (bytes / time
from staging to commit) against the checkpoint disk's sequential write rate, measured in the
same run (`--disk-gb` GB written and fsynced into the checkpoint folder before the arms).

    python benchmarks/recovery/hostcopy.py --nproc 2 --faults 3 --repeats 2 --json /tmp/hc.json
    python benchmarks/recovery/hostcopy.py --nproc 1 --backend nccl --demo-args "--width 4096" ...
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib import cli, procs, stats  # noqa: E402
from _lib.host import disk_rate  # noqa: E402
from _lib.runs import report_json, run_events  # noqa: E402
from side_by_side import policy_text, run_nvtrain  # noqa: E402

from nvtrain.events.records import CheckpointCommitted, CheckpointRestored, CheckpointStaged  # noqa: E402
from nvtrain.launcher.process import become_subreaper, kill_all  # noqa: E402

PHASES = ("detection", "teardown", "rendezvous", "start", "restore", "first_step")


def saves(run_dir: Path) -> dict[str, Any]:
    """Blocked time of the first save and the later ones; background write rates."""
    events = run_events(run_dir)  # every pod's log, merged in time order
    staged = [e for e in events if isinstance(e, CheckpointStaged) and e.is_async]
    by_pid: dict[int | None, list[CheckpointStaged]] = {}
    for e in staged:
        by_pid.setdefault(e.pid, []).append(e)
    firsts = [v[0].blocked_s for v in by_pid.values() if v]
    later = [e.blocked_s for v in by_pid.values() for e in v[1:] if e.blocked_s is not None]
    rates = [
        e.bytes / e.write_s / 1e9
        for e in events
        if isinstance(e, CheckpointCommitted) and e.write_s and e.bytes
    ]
    restored = [e for e in events if isinstance(e, CheckpointRestored)]
    return {
        "load_s": {
            origin: [e.seconds for e in restored if e.origin == origin] for origin in ("memory", "storage")
        },
        "first_blocked_s": firsts,
        "later_blocked_median_s": statistics.median(later) if later else None,
        "write_gb_s": rates,
        "bytes": max((e.bytes or 0 for e in staged), default=0),
    }


def main() -> None:
    parser = cli.parser(__doc__, part="all")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    parser.add_argument("--demo-args", default="")
    parser.add_argument("--steps", type=int, default=90)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--faults", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--arms", default="memory,storage")
    parser.add_argument("--disk-gb", type=float, default=2.0)
    parser.add_argument("--memory-dir", default="/dev/shm", help="the memory arm's [checkpoint] memory_dir")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--out", type=Path, default=Path("/tmp/nvtrain-hostcopy"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    # what policy_text reads from side_by_side's arguments
    args.kinds, args.fault_offset, args.finish_in_flight = "sigkill", None, "true"
    args.collective_timeout = "3s" if args.backend == "gloo" else "12s"
    args.soft_timeout, args.hard_timeout, args.heartbeat_timeout = "4s", "10s", "15s"
    become_subreaper()
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt = args.out / "ckpt"
    results: dict[str, Any] = {
        "started": cli.utc_now(),
        "args": cli.args_record(args),
        "disk_gb_s": round(disk_rate(ckpt, args.disk_gb), 3),
        "runs": {},
    }
    print(f"checkpoint disk: {results['disk_gb_s']} GB/s sequential write", flush=True)
    for repeat in range(args.repeats):
        for arm in args.arms.split(","):
            text = policy_text("in-job", "async", args, ckpt, procs.free_port())
            memory_dir = "" if arm == "storage" else args.memory_dir
            text = text.replace("keep = 2\n", f'keep = 2\nmemory_dir = "{memory_dir}"\n', 1)
            if arm == "warm":
                text = text.replace("[rendezvous]", "warm_start = true\n\n[rendezvous]", 1)
            run_id = f"{arm}-{repeat}-{int(time.time())}"
            policy = args.out / f"{arm}-{repeat}.toml"
            policy.write_text(text)
            t0 = time.monotonic()
            code = run_nvtrain(policy, run_id, args.out / f"{arm}-{repeat}.log", args.timeout)
            wall = time.monotonic() - t0
            leftovers = kill_all(timeout=0.0)
            rep = report_json(ckpt / run_id)
            incidents = [
                {
                    "recovery_s": i.get("recovery_s"),
                    "restore_source": i.get("restore_source"),
                    **{p: (i.get("phases_s") or {}).get(p) for p in PHASES},
                }
                for i in rep.get("incidents", [])
            ]
            left_shm = sorted(p.name for p in Path(args.memory_dir).glob(f"nvtrain-{run_id}-*"))
            results["runs"][f"{arm}#{repeat + 1}"] = {
                "exit_code": code,
                "wall_s": round(wall, 2),
                "leftover_processes": len(leftovers),
                "leftover_shm": left_shm,
                "incidents": incidents,
                "saves": saves(ckpt / run_id),
            }
            print(f"{arm}#{repeat + 1}: exit {code}, {wall:.1f} s, incidents {incidents}", flush=True)
            cli.write_json(args.json, results)
    print(summary(results))


def summary(results: dict[str, Any]) -> str:
    rows = [
        "| arm | incidents | restored from | SIGKILL -> next step median (s) | "
        + " | ".join(PHASES)
        + " | load from memory / storage (s) | first save blocked (s) | later saves blocked (s)"
        + " | write GB/s |",
        "|---|---|---|---|" + "---|" * len(PHASES) + "---|---|---|---|",
    ]
    arms: dict[str, list[dict[str, Any]]] = {}
    for key, run in results["runs"].items():
        arms.setdefault(key.split("#")[0], []).append(run)
    medians = {}
    for arm, runs in arms.items():
        inc = [i for r in runs for i in r["incidents"] if i["recovery_s"] is not None]

        def med(values: list[Any]) -> str:
            return stats.fmt(stats.median(values), missing="-")

        sources = sorted({str(i["restore_source"]) for i in inc})
        medians[arm] = statistics.median([i["recovery_s"] for i in inc]) if inc else None
        firsts = [v for r in runs for v in r["saves"]["first_blocked_s"]]
        later = [r["saves"]["later_blocked_median_s"] for r in runs]
        rates = [v for r in runs for v in r["saves"]["write_gb_s"]]
        loads = {o: [v for r in runs for v in r["saves"]["load_s"][o]] for o in ("memory", "storage")}
        rows.append(
            f"| {arm} | {len(inc)} | {', '.join(sources)} | {med([i['recovery_s'] for i in inc])} | "
            + " | ".join(med([i[p] for i in inc]) for p in PHASES)
            + f" | {med(loads['memory'])} / {med(loads['storage'])}"
            + f" | {med(firsts)} | {med(later)} | {med(rates)} |"
        )
    rows.append("")
    for arm in ("memory", "warm"):
        if medians.get(arm) and medians.get("storage"):
            rows.append(f"{arm} / storage median recovery: x{medians[arm] / medians['storage']:.2f}")
    rows.append(f"checkpoint disk sequential write: {results['disk_gb_s']} GB/s")
    return "\n".join(rows)


if __name__ == "__main__":
    main()

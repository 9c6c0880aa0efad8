"""A lost pod restored from the copies another pod keeps, against storage (issue 16, CPU).

2 pods x 2 ranks on one machine: network namespaces with their own ``/dev/shm``, a real dnsmasq,
``nvtrain run`` + ft_launcher, gloo (``tests/launcher/multinode/netns_pods.py``); the CPU demo with
``--width W`` (FSDP2 over the 4 ranks). Per repeat, arms in turn:

- ``peer``: ``[checkpoint] peer_copy = true``; ``storage``: ``peer_copy = false`` (the same job).

Rank 0 hangs right after the save of step ``--saved`` (so the newest commit is known when the
pod dies). Once that step is committed (and, in the ``peer`` arm, every rank's copy of it
exchanged), every process of pod 1 is killed, its namespace removed, and a new pod 1 started at
once under the same name. Measured from the events log: kill -> the job's next step; each
rank's restore (``checkpoint_restored``: origin, load seconds); and, over the saves before the
kill, each exchange (``checkpoint_replicated``: seconds, bytes) and how long saves blocked.

    .venv/bin/python benchmarks/recovery/lost_pod.py --width 2048 --repeats 3 \\
        --json benchmarks/recovery/results/cpu-lost-pod.json

Needs root, iproute2, util-linux and dnsmasq-base (as the multi-node tests).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib import REPO  # noqa: E402
from _lib.runs import run_events as read_events  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "launcher" / "multinode"))
from netns_pods import Cluster, environment_problem, policy_toml  # noqa: E402

from nvtrain.events.records import (  # noqa: E402
    CheckpointCommitted,
    CheckpointReplicated,
    CheckpointRestored,
    CheckpointStaged,
    Step,
)

NODES, NPROC = 2, 2


def policy(cluster: Cluster, path: Path, checkpoints: Path, args: argparse.Namespace, peer: bool) -> Path:
    text = policy_toml(
        job=cluster.job,
        nodes=NODES,
        nproc_per_node=NPROC,
        steps=args.steps,
        checkpoint_dir=checkpoints,
        step_time=0.0,
        log_every=1,
        collective_timeout="90s",
        checkpoint_interval=args.interval,
    )
    text = text.replace('"--log-every", "1"]', f'"--log-every", "1", "--width", "{args.width}"]')
    text = text.replace('timeout = "10s"\nmonitor_interval', 'timeout = "60s"\nmonitor_interval')
    text = text.replace('initial_timeout = "30s"', 'initial_timeout = "90s"')
    text = text.replace("[job]\n", '[job]\nbackend = "gloo"\n', 1)
    text += f"async = true\npeer_copy = {'true' if peer else 'false'}\n"
    text += f'\n[[faults]]\nstep = {args.saved}\nrank = 0\nkind = "hang"\n'
    path.write_text(text)
    return path


def one_run(workdir: Path, args: argparse.Namespace, arm: str, repeat: int) -> dict[str, Any]:
    run_id = f"{arm}{repeat}"
    with Cluster(workdir / run_id, job=f"lp{repeat}{arm[0]}") as cluster:
        checkpoints = workdir / run_id / "checkpoints"
        path = policy(cluster, workdir / f"{run_id}.toml", checkpoints, args, arm == "peer")
        run_dir = checkpoints / run_id  # every pod's events log: events-node<N>.jsonl
        for i in range(NODES):
            cluster.start_nvtrain(i, path, run_id=run_id, publish=True)
        deadline = time.monotonic() + args.timeout

        def ready() -> bool:
            events = read_events(run_dir)
            committed = any(isinstance(e, CheckpointCommitted) and e.step == args.saved for e in events)
            exchanged = {
                e.rank for e in events if isinstance(e, CheckpointReplicated) and e.step == args.saved
            }
            return committed and (arm == "storage" or exchanged == set(range(NODES * NPROC)))

        while not ready():
            if time.monotonic() > deadline:
                raise SystemExit(f"{run_id}: step {args.saved} never committed\n{cluster.describe()}")
            time.sleep(0.05)
        killed = time.time()
        cluster.kill_pod(1)
        cluster.replace_pod(1, path, run_id=run_id)
        while any(p.returncode() is None for p in cluster.pods.values()):
            if time.monotonic() > deadline:
                raise SystemExit(f"{run_id}: did not finish\n{cluster.describe()}")
            time.sleep(0.2)
        codes = {i: p.returncode() for i, p in cluster.pods.items()}
        if codes != {0: 0, 1: 0}:
            raise SystemExit(f"{run_id}: exit codes {codes}\n{cluster.describe()}")
        events = read_events(run_dir)
    before = [e for e in events if e.ts < killed]
    after = [e for e in events if e.ts > killed]
    first_step = min(e.ts for e in after if isinstance(e, Step))
    restores: dict[int, CheckpointRestored] = {}
    for e in after:
        if isinstance(e, CheckpointRestored) and e.rank is not None:
            restores.setdefault(e.rank, e)
    exchanges = [e for e in before if isinstance(e, CheckpointReplicated) and e.seconds]
    staged = [e for e in before if isinstance(e, CheckpointStaged)]
    return {
        "arm": arm,
        "repeat": repeat,
        "kill_to_next_step_s": round(first_step - killed, 3),
        "restores": {
            r: {"step": e.step, "origin": e.origin, "load_s": e.seconds} for r, e in sorted(restores.items())
        },
        "exchange_s": [e.seconds for e in exchanges],
        "exchange_bytes": max((e.sent_bytes or 0 for e in exchanges), default=0),
        "blocked_s": [e.blocked_s for e in staged if e.blocked_s is not None],
        "state_bytes_per_rank": max((e.bytes or 0 for e in staged), default=0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--interval", type=int, default=5)
    parser.add_argument("--saved", type=int, default=20, help="the save after which the pod is lost")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arms", default="peer,storage")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    problem = environment_problem()
    if problem:
        raise SystemExit(f"cannot emulate pods here: {problem}")
    runs = []
    with tempfile.TemporaryDirectory(prefix="nvt-lostpod-") as tmp:
        for repeat in range(args.repeats):
            for arm in args.arms.split(","):
                run = one_run(Path(tmp), args, arm, repeat)
                print(json.dumps(run), flush=True)
                runs.append(run)
    summary = {}
    for arm in args.arms.split(","):
        mine = [r for r in runs if r["arm"] == arm]
        loads = {
            origin: [x["load_s"] for r in mine for x in r["restores"].values() if x["origin"] == origin]
            for origin in ("memory", "peer", "storage")
        }
        summary[arm] = {
            "kill_to_next_step_median_s": statistics.median(r["kill_to_next_step_s"] for r in mine),
            "load_median_s": {o: statistics.median(v) for o, v in loads.items() if v},
            "loads": {o: len(v) for o, v in loads.items()},
            "exchange_median_s": statistics.median([s for r in mine for s in r["exchange_s"]] or [0.0]),
            "blocked_median_s": statistics.median([s for r in mine for s in r["blocked_s"]] or [0.0]),
        }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "runs": runs, "summary": summary}, indent=2
            )
        )


if __name__ == "__main__":
    main()

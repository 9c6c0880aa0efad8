"""Scale on one host: N nodes x M gloo ranks on loopback, each phase of a recovery per world size.

Each node is one launcher started with the bare-metal flags (``nvtrain run --nnodes N
--node-rank I --rdzv-endpoint 127.0.0.1:PORT``; torchrun the same with its c10d rendezvous),
all on this machine (``NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE=1``: NVRx 0.7 refuses several
launchers on one host without it). Arms, one run per shape each:

* ``nvtrain``: the demo (``nvtrain.demo``, a tiny FSDP2 model, ``--width 64``) under the demo's
  policy shape (in-process restart on), faults on the last rank: a SIGKILL, an exception and a
  hang; every incident's phases from ``nvtrain report --json`` (the events log: detection,
  teardown, rendezvous, start, restore, first step) and the job's start-up;
* ``plain`` and ``torchrun``: ``benchmarks/recovery/worker.py`` (a torch DDP-style gloo script
  that knows nothing of nvtrain) SIGKILLing its last rank once, under ``nvtrain run`` (in-job
  restart) and under ``torchrun --max-restarts=1``; fault -> next step from the worker's own
  ``BENCH`` lines, split into respawn (detection, rendezvous, spawn), build (torch import, model)
  and join (process group, first step).

While a run goes, the rendezvous store's sockets (``ss -ti`` on its port: segments and bytes in)
and the established TCP connections on loopback are sampled every ``--sample`` seconds: the
store's requests per phase and the gloo mesh (world x (world - 1) / 2 pairs) as the world grows.

    python benchmarks/scale/world.py --shapes 2x2 --json /tmp/world.json
    python benchmarks/scale/world.py --shapes 2x8,8x8,16x8,32x8 --timeout 240 --json out.json
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib import cli, host, procs, stats  # noqa: E402
from _lib.policy import write_policy  # noqa: E402
from _lib.runs import report_json, run_events  # noqa: E402

from nvtrain.launcher.process import become_subreaper, descendants, kill_all  # noqa: E402

WORKER = Path(__file__).resolve().parents[1] / "recovery" / "worker.py"
PHASES = ("detection", "teardown", "rendezvous", "start", "restore", "first_step")
BENCH_PHASES = ("respawn", "build", "join")
_BENCH = re.compile(
    r"BENCH (?P<kind>\w+) rank=(?P<rank>\d+) pid=(?P<pid>\d+) \S+ ts=(?P<ts>[\d.]+)(?: step=(?P<step>\d+))?"
)


class Sampler(threading.Thread):
    """Every ``every`` seconds: the server sockets of the rendezvous store (``port``) and of the
    workers' stores (``MASTER_PORT`` and the next port, read from a worker's environment),
    their segments and bytes in (``ss -ti``) summed over every connection seen (a closed one
    keeps its last figures), and the number of established TCP connections (the gloo mesh)."""

    def __init__(self, port: int, every: float) -> None:
        super().__init__(daemon=True)
        self.port, self.every = port, every
        self.samples: list[tuple[float, dict[str, tuple[int, int]], int]] = []  # time, totals, conns
        self.peak_conns = 0
        self.worker_ports: set[int] = set()
        self._halt = threading.Event()
        self._seen: dict[tuple[str, str], tuple[int, int]] = {}  # (store, connection): segs, bytes

    def run(self) -> None:
        if shutil.which("ss") is None:
            return
        while not self._halt.wait(self.every):
            with contextlib.suppress(OSError, subprocess.SubprocessError, psutil.Error):
                self._sample()

    def _find_worker_port(self) -> None:
        for proc in reversed(descendants()):  # the newest first: a restart may move the port
            with contextlib.suppress(psutil.Error):
                if port := proc.environ().get("MASTER_PORT"):
                    self.worker_ports |= {int(port), int(port) + 1}
                    return

    def _sample(self) -> None:
        self._find_worker_port()
        ports = {self.port: "rdzv", **{p: "workers" for p in self.worker_ports if p != self.port}}
        where = " or ".join(f"sport = :{p}" for p in ports)
        out = subprocess.run(
            ["ss", "-tinH", "state", "established", f"( {where} )"],
            capture_output=True, text=True, timeout=10, check=False,
        ).stdout  # fmt: skip
        key: tuple[str, str] | None = None
        for line in out.splitlines():
            if not line.startswith(("\t", " ")):
                words = line.split()
                local = words[-2] if len(words) >= 2 else ""
                store = ports.get(int(local.rsplit(":", 1)[-1])) if local[-1:].isdigit() else None
                key = None if store is None else (store, local + ">" + words[-1])
                continue
            segs = re.search(r"segs_in:(\d+)", line)
            got = re.search(r"bytes_received:(\d+)", line)
            if key is not None and segs:
                self._seen[key] = (int(segs[1]), int(got[1]) if got else 0)
        conns = subprocess.run(
            ["ss", "-tanH", "state", "established"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.count("\n")
        self.peak_conns = max(self.peak_conns, conns)
        totals: dict[str, tuple[int, int]] = {}
        for (store, _), (segs_in, bytes_in) in self._seen.items():
            was = totals.get(store, (0, 0))
            totals[store] = (was[0] + segs_in, was[1] + bytes_in)
        self.samples.append((time.time(), totals, conns))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=15)

    def between(self, start: float, end: float | None) -> dict[str, Any] | None:
        """Each store's segments and bytes in from ``start`` to ``end`` (the nearest samples
        outside), and the most TCP connections sampled in between."""
        if end is None or not self.samples:
            return None
        before = [s for s in self.samples if s[0] <= start] or self.samples[:1]
        after = [s for s in self.samples if s[0] >= end] or self.samples[-1:]
        a, b = before[-1], after[0]
        out: dict[str, Any] = {"seconds": round(b[0] - a[0], 2)}
        for store in ("rdzv", "workers"):
            old, new = a[1].get(store, (0, 0)), b[1].get(store, (0, 0))
            out[f"{store}_segs_in"], out[f"{store}_bytes_in"] = new[0] - old[0], new[1] - old[1]
        out["tcp_connections"] = max((s[2] for s in self.samples if a[0] <= s[0] <= b[0]), default=0)
        return out


def nvtrain_policy(work: Path, ranks: int, nproc: int, plain: bool, steps: int, faults: list[int]) -> Path:
    """The policy of the ``nvtrain`` (the demo) or ``plain`` (worker.py) arm."""
    last = ranks - 1
    job: dict[str, Any] = {
        "name": "scale-world",
        "nproc_per_node": nproc,
        "backend": "gloo",
        "max_steps": steps,
    }
    if plain:
        job |= {"script": str(WORKER), "collective_timeout": "60s"}
        job["args"] = ["--steps", str(steps), "--state-dir", str(work / "state"), "--fault-rank", str(last)]
        job["args"] += ["--faults", str(faults[0])]
        restart: dict[str, Any] = {
            "escalate_after": 2,
            "in_process": {"enabled": False},
            "in_job": {"max_restarts": 1},
        }
        chosen: list[dict[str, Any]] = []
    else:
        job |= {"module": "nvtrain.demo", "collective_timeout": "8s"}
        job["args"] = ["--steps", str(steps), "--width", "64", "--log-every", str(steps)]
        in_process = {"enabled": True, "max_attempts": 5, "soft_timeout": "10s", "hard_timeout": "15s"}
        restart = {"escalate_after": 4, "in_process": in_process, "in_job": {"max_restarts": 3}}
        kinds = ("sigkill", "exception", "hang")
        chosen = [{"step": s, "rank": last, "kind": k} for s, k in zip(faults, kinds, strict=False)]
    tables = {
        "job": job,
        "rendezvous": {
            "nodes": ranks // nproc,
            "join_timeout": "600s",
        },  # (as --nnodes: the checks count ranks)
        "heartbeat": {
            "initial_timeout": "600s",
            "timeout": "20s" if not plain else "120s",
            "monitor_interval": "1s",
        },
        "restart": restart,
        "checkpoint": {"dir": str(work / "ckpt"), "interval": 10, "async": True, "keep": 2},
    }
    return write_policy(work / "policy.toml", tables, chosen)


def node_argv(arm: str, work: Path, node: int, nodes: int, nproc: int, port: int, args: Any) -> list[str]:
    flags = ["--nnodes", str(nodes), "--node-rank", str(node), "--rdzv-endpoint", f"127.0.0.1:{port}"]
    if arm == "torchrun":
        wargs = ["--steps", str(args.plain_steps), "--state-dir", str(work / "state")]
        wargs += ["--fault-rank", str(nodes * nproc - 1), "--faults", str(args.fault_steps[0])]
        head = procs.torchrun_argv(
            nproc, *flags, "--rdzv-backend=c10d", "--rdzv-id=world", "--max-restarts=1"
        )
        return [*head, "--monitor-interval=1", str(WORKER), *wargs]
    return procs.nvtrain_argv("run", *flags, "--run-id", "world", str(work / "policy.toml"))


def launch(arm: str, nodes: int, nproc: int, args: Any, root: Path) -> dict[str, Any]:
    """One run of ``arm`` at ``nodes`` x ``nproc``: every node's launcher, their logs, the samples."""
    work = root / f"{arm}-{nodes}x{nproc}"
    work.mkdir(parents=True)
    port = procs.free_port()
    steps = args.plain_steps if arm != "nvtrain" else args.steps
    if arm != "torchrun":
        nvtrain_policy(work, nodes * nproc, nproc, arm == "plain", steps, args.fault_steps)
    env = {**os.environ, "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "1", "OMP_NUM_THREADS": "1"}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as benchmarks/recovery/sigkill.py, both arms
    sampler = Sampler(port, args.sample)
    sampler.start()
    start, t0 = time.time(), time.monotonic()
    running: list[subprocess.Popen[bytes]] = []
    for node in range(nodes):
        with (work / f"node{node}.log").open("wb") as log:
            argv = node_argv(arm, work, node, nodes, nproc, port, args)
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True
            )
            running.append(proc)
    codes: list[int] = []
    timed_out = False
    for proc in running:
        try:
            codes.append(proc.wait(timeout=max(0.1, args.timeout - (time.monotonic() - t0))))
        except subprocess.TimeoutExpired:
            timed_out = True
            procs.kill_group(proc.pid)
            codes.append(proc.wait())
    wall = time.monotonic() - t0
    for proc in running:  # each launcher's group: what it left behind
        procs.kill_group(proc.pid)
    leftovers = len(descendants())
    kill_all(timeout=2.0)
    sampler.stop()
    text = "\n".join((work / f"node{n}.log").read_text(errors="replace") for n in range(nodes))
    result: dict[str, Any] = {"arm": arm, "nodes": nodes, "nproc": nproc, "ranks": nodes * nproc}
    result |= {"exit_codes": codes, "timed_out": timed_out, "wall_s": round(wall, 2), "leftovers": leftovers}
    result |= {"peak_tcp_connections": sampler.peak_conns, "loadavg": os.getloadavg()[0]}
    bench = bench_events(text)
    if bench:
        result |= bench_phases(bench, start, sampler)
    if arm != "torchrun":
        found = report_phases(work / "ckpt" / "world", sampler)
        if found.get("startup_s") is None:  # worker.py reports no steps to nvtrain: its own lines say
            found.pop("startup_s", None)
        result |= found
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return result


def bench_events(text: str) -> list[dict[str, Any]]:
    found = []
    for m in _BENCH.finditer(text):
        found.append({"kind": m["kind"], "pid": int(m["pid"]), "ts": float(m["ts"]), "step": m["step"]})
    return sorted(found, key=lambda e: e["ts"])


def bench_phases(events: list[dict[str, Any]], start: float, sampler: Sampler) -> dict[str, Any]:
    """Start-up and the SIGKILL's recovery from worker.py's lines (one fault per run)."""
    steps = [e for e in events if e["kind"] == "step"]
    out: dict[str, Any] = {"startup_s": round(steps[0]["ts"] - start, 3) if steps else None}
    fault = next((e for e in events if e["kind"] == "fault"), None)
    if fault is None:
        return out
    old = {e["pid"] for e in events if e["ts"] <= fault["ts"]}
    after = [e for e in events if e["ts"] > fault["ts"] and e["pid"] not in old]
    step = next((e for e in after if e["kind"] == "step"), None)
    group = [e for e in after if step is None or e["ts"] <= step["ts"]]
    starts = [e["ts"] for e in group if e["kind"] == "start"]
    built = [e["ts"] for e in group if e["kind"] == "built"]
    row: dict[str, Any] = {
        "cause": "sigkill",
        "recovery_s": None if step is None else step["ts"] - fault["ts"],
    }
    row["respawn"] = min(starts) - fault["ts"] if starts else None
    row["build"] = max(built) - min(starts) if starts and built else None
    row["join"] = step["ts"] - max(built) if step and built else None
    row = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
    row["store"] = sampler.between(fault["ts"], None if step is None else step["ts"])
    out["bench"] = row
    return out


def report_phases(run_dir: Path, sampler: Sampler) -> dict[str, Any]:
    """Start-up and every incident's phases from ``nvtrain report --json``."""
    data = report_json(run_dir, timeout=300)
    if "error" in data:
        return {"report_error": data["error"]}
    incidents = []
    events = run_events(run_dir)
    for inc in data["incidents"]:
        row = {"cause": inc["cause"], "layer": inc["layer"], "recovery_s": inc["recovery_s"]}
        row |= {p: inc["phases_s"].get(p) for p in PHASES}
        if events and inc.get("start_t_s") is not None and inc["recovery_s"] is not None:
            t0 = events[0].ts + float(inc["start_t_s"])  # the job's start: its first event
            row["store"] = sampler.between(t0, t0 + float(inc["recovery_s"]))
        incidents.append(row)
    time_s = data.get("time_s", {})
    return {"startup_s": time_s.get("startup"), "incidents": incidents, "steps": data.get("steps")}


COLUMNS = ("recovery_s", *PHASES, *BENCH_PHASES)


def table(results: list[dict[str, Any]]) -> str:
    """One row per world size, arm and fault: the recovery, its phases (seconds), the stores'
    segments in and the most TCP connections during it; the job's start-up to its first step."""
    head = ["ranks", "shape", "arm", "fault", "layer", "recovery", *PHASES, *BENCH_PHASES]
    head += ["rdzv store segs", "workers' store segs", "TCP conns", "start-up"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        rows = list(r.get("incidents", [])) + ([r["bench"] | {"layer": "(BENCH)"}] if "bench" in r else [])
        for inc in rows or [{"cause": "none", "layer": "-"}]:
            store = inc.get("store") or {}
            cells = [
                str(r["ranks"]),
                f"{r['nodes']}x{r['nproc']}",
                r["arm"],
                str(inc["cause"]),
                str(inc["layer"]),
            ]
            cells += [stats.fmt(inc.get(k)) for k in COLUMNS]
            cells += [str(store.get(k, "–")) for k in ("rdzv_segs_in", "workers_segs_in", "tcp_connections")]
            lines.append("| " + " | ".join([*cells, stats.fmt(r.get("startup_s"))]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = cli.parser(__doc__, part="all")
    parser.add_argument("--shapes", default="2x2", help="NODESxRANKS, comma-separated")
    parser.add_argument("--arms", default="nvtrain,plain,torchrun")
    parser.add_argument("--steps", type=int, default=70, help="the demo's steps")
    parser.add_argument("--plain-steps", type=int, default=40, help="worker.py's steps")
    parser.add_argument("--fault-steps", default="15,35,55", help="steps of the SIGKILL, exception, hang")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--sample", type=float, default=0.5, help="seconds between socket samples")
    parser.add_argument("--keep", type=Path, help="keep each run's folder under KEEP")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.fault_steps = [int(s) for s in args.fault_steps.split(",")]
    become_subreaper()
    root = args.keep or Path(tempfile.mkdtemp(prefix="nvtrain-world-"))
    record: dict[str, Any] = {"machine": host.machine(), "args": cli.args_record(args), "results": []}
    for shape in args.shapes.split(","):
        nodes, nproc = (int(x) for x in shape.split("x"))
        for arm in args.arms.split(","):
            result = launch(arm, nodes, nproc, args, root)
            record["results"].append(result)
            print(json.dumps(result), flush=True)
            cli.write_json(args.json, record, indent=1)  # as it goes: a later shape may time out
    print(table(record["results"]))
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

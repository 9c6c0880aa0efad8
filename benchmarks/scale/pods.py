"""Scale: `nvtrain run` on 2, 4, 8, 16 ... pods, one rank each, on one CPU machine.

Each pod is a network namespace with its own address, hostname and /etc/hosts, and the pods'
names are served by a real dnsmasq as a headless Service's records
(``tests/launcher/multinode/netns_pods.py``). Every pod runs ``python -m nvtrain run POLICY``: the CPU
demo (FSDP2 over gloo, 1 rank per pod, async checkpoints every ``--interval`` steps) under
NVRx's ft_launcher. One run per (pod count, repeat), each on a fresh cluster:

1. start-up: every pod's namespace and DNS records are made first; then every pod's
   ``nvtrain run`` is started, back to back. Time from the first start to the job's first
   completed step (the first ``step`` event in the events log; also when every rank had one),
   split by the last pod's launcher milestones (``launcher_start``, ``dns_resolved``,
   ``launcher_started``, ``rendezvous_done``, ``worker_start``);
2. steady state, ``--window`` steps: memory per pod (RSS, PSS and USS summed over the pod's
   processes: ``nvtrain run``, ft_launcher, rank monitor, worker; psutil), sampled
   ``--mem-samples`` times; the events log's lines and bytes per pod per step and per minute;
   the step time; the rendezvous store's traffic (bytes and data segments per second that its
   server sockets in pod 0 received and sent: ``ss -ti`` counters at both ends of the window);
3. SIGKILL of the worker of the last pod (pod N-1: not the store's host) -> the next step of
   the job (a ``step`` event from a worker process started after the kill);
4. a lost pod: every process of pod N-1 SIGKILLed, its namespace (address) and DNS records
   removed; ``--down`` s after the kill a replacement is started under the same name with a new
   address (as the multi-node tests do) -> the next step of the job.

Also counted: DNS queries dnsmasq answered (by type, and within the start-up and each
recovery), and the events log's lines per pod in those windows. Then the cluster is torn
down: namespaces, links, dnsmasq and every process, also on failure, Ctrl-C or SIGTERM. The
driver checks that nothing of a run is left (processes carrying the run id, namespaces of the
cluster, dnsmasq).

    # root, iproute2, util-linux, dnsmasq-base
    .venv/bin/python benchmarks/scale/pods.py --pods 2,4,8,16 --repeats 3 \\
        --json benchmarks/scale/results/cpu-pods.json

``--src DIR`` runs the nvtrain package found in DIR (put first on the pods' PYTHONPATH), e.g.
a snapshot of a commit (``git archive HEAD src | tar -x -C /tmp/snap``), so that edits to the
working tree while the benchmark runs do not change what it measures. Pod logs, dnsmasq's log
and the events logs are kept under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib import REPO, host, stats  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "launcher" / "multinode"))
from netns_pods import Cluster, Pod, environment_problem, list_namespaces, namespace_pids  # noqa: E402

from nvtrain.events import parse_event  # noqa: E402
from nvtrain.events.records import (  # noqa: E402
    DnsResolved,
    Event,
    LauncherError,
    LauncherStart,
    LauncherStarted,
    Relaunch,
    RendezvousDone,
    Step,
    WorkerFailed,
    WorkerStart,
)
from nvtrain.runlog import RunTail, pod_files  # noqa: E402

JOB = "scale"
WORKER_MODULE = "nvtrain.demo"
LAUNCHER_MODULE = "nvidia_resiliency_ext.fault_tolerance.launcher"
STORE_PORT = 29500

E = TypeVar("E", bound=Event)


class Failed(RuntimeError):
    """A phase of a run did not finish in time (the run is recorded with its error)."""


# --------------------------------------------------------------------------- the policy


def policy_text(opts: argparse.Namespace, nodes: int, checkpoints: Path) -> str:
    demo = ["--steps", str(opts.steps), "--step-time", str(opts.step_time), "--log-every", "10"]
    return f"""\
[job]
name = "{JOB}"
module = "{WORKER_MODULE}"
args = {json.dumps(demo)}
nproc_per_node = 1
max_steps = {opts.steps}
backend = "gloo"
stop_timeout = "15s"
collective_timeout = "{opts.collective_timeout}"

[rendezvous]
nodes = {nodes}
namespace = "default"
cluster_domain = "nvtrain.test"
port = {STORE_PORT}
dns_timeout = "300s"
join_timeout = "600s"

[heartbeat]
initial_timeout = "600s"
timeout = "120s"
monitor_interval = "1s"

[restart]
escalate_after = 5

[restart.in_process]
enabled = false

[restart.in_job]
max_restarts = 10

[checkpoint]
dir = "{checkpoints}"
interval = {opts.interval}
async = true
keep = 2
"""


# --------------------------------------------------------------------------- the events log


class EventsTail:
    """Reads the run's events logs (every pod's ``events-node<N>.jsonl`` in the run directory)
    as they grow: ``events``, every valid event so far in time order."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._tail = RunTail(run_dir)
        self.events: list[Event] = []

    def poll(self) -> list[Event]:
        new = self._tail.poll()
        if new:  # the pods' logs are read one after the other: merge them in time order
            self.events.extend(new)
            self.events.sort(key=lambda e: e.ts)
        return self.events

    def of(self, kind: type[E]) -> list[E]:
        """The events so far that are ``kind`` records."""
        return [e for e in self.events if isinstance(e, kind)]


def _steps(events: list[Event]) -> list[Step]:
    return [e for e in events if isinstance(e, Step) and e.step is not None]


def max_step(tail: EventsTail) -> int:
    return max((e.step for e in _steps(tail.events) if e.step is not None), default=0)


def new_steps(tail: EventsTail, after: float, old_pids: set[int]) -> list[Step]:
    """Step events after ``after`` from worker processes that did not step before."""
    return [e for e in _steps(tail.events) if e.ts > after and e.pid not in old_pids]


def stepping_pids(tail: EventsTail) -> set[int]:
    return {e.pid for e in _steps(tail.events) if e.pid is not None}


def milestones(tail: EventsTail, after: float, until: float) -> dict[str, float | None]:
    """For each launcher/worker milestone: the last node's first event in (after, until],
    relative to ``after`` (the last node is what the whole job waits for)."""
    out: dict[str, float | None] = {}
    for kind in (LauncherStart, DnsResolved, LauncherStarted, WorkerFailed, RendezvousDone):
        first: dict[Any, float] = {}
        for e in tail.of(kind):
            if after < e.ts <= until:
                first.setdefault(e.node, e.ts)
        out[kind.NAME] = round(max(first.values()) - after, 3) if first else None
    first_start: dict[Any, float] = {}
    for start in tail.of(WorkerStart):
        if after < start.ts <= until:
            first_start.setdefault(start.rank, start.ts)
    out["worker_start"] = round(max(first_start.values()) - after, 3) if first_start else None
    return out


# --------------------------------------------------------------------------- processes


def _cmdline(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline())
    return ""


def pod_processes(pod: Pod) -> dict[str, list[psutil.Process]]:
    """The pod's processes by kind: nvtrain (``nvtrain run``), guard (nvtrain's watchdog of
    ft_launcher's session), ft_launcher, rank_monitor (forked from ft_launcher: the same command
    line), worker, other."""
    kinds: dict[str, list[psutil.Process]] = {
        k: [] for k in ("nvtrain", "guard", "ft_launcher", "rank_monitor", "worker", "other")
    }
    launchers: list[psutil.Process] = []
    for pid in namespace_pids(pod.ns):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = _cmdline(proc)
            if LAUNCHER_MODULE in cmd:  # ft_launcher and its forked rank monitors (same argv)
                launchers.append(proc)
            elif f"-m {WORKER_MODULE}" in cmd:
                kinds["worker"].append(proc)
            elif "-m nvtrain.launcher.process" in cmd:  # nvtrain's guard of ft_launcher's session
                kinds["guard"].append(proc)
            elif "-m nvtrain run" in cmd:
                kinds["nvtrain"].append(proc)
            else:
                kinds["other"].append(proc)
    pids = {p.pid for p in launchers}
    for proc in launchers:
        with contextlib.suppress(psutil.Error):
            # A rank monitor is forked by ft_launcher (its parent is a launcher, or nvtrain run,
            # the subreaper, once that launcher is gone); ft_launcher is nvtrain run's child and
            # the parent of the workers. Tell them apart by the workers' parent, else by age.
            kinds[
                "ft_launcher" if proc.ppid() not in pids and _parents_workers(proc) else "rank_monitor"
            ].append(proc)
    if not kinds["ft_launcher"] and kinds["rank_monitor"]:
        oldest = min(kinds["rank_monitor"], key=lambda p: p.create_time())
        kinds["rank_monitor"].remove(oldest)
        kinds["ft_launcher"].append(oldest)
    return kinds


def _parents_workers(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        cmds = [_cmdline(c) for c in proc.children()]
        return any(f"-m {WORKER_MODULE}" in c and LAUNCHER_MODULE not in c for c in cmds)
    return False


def pod_memory(pod: Pod) -> dict[str, Any]:
    """RSS, PSS and USS (MiB) of the pod's processes, by kind and summed."""
    out: dict[str, Any] = {"by_kind": {}, "rss": 0.0, "pss": 0.0, "uss": 0.0, "processes": 0}
    for kind, procs in pod_processes(pod).items():
        row = {"n": 0, "rss": 0.0, "pss": 0.0, "uss": 0.0}
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                info = proc.memory_full_info()
                row["n"] += 1
                for key in ("rss", "pss", "uss"):
                    row[key] += getattr(info, key) / 2**20
        if row["n"]:
            out["by_kind"][kind] = {k: round(v, 1) if k != "n" else v for k, v in row.items()}
            if kind == "other":
                out["other_cmdlines"] = [_cmdline(p)[:200] for p in procs]
        out["processes"] += row["n"]
        for key in ("rss", "pss", "uss"):
            out[key] += row[key]
    for key in ("rss", "pss", "uss"):
        out[key] = round(out[key], 1)
    return out


def run_id_processes(run_id: str) -> list[int]:
    """Live processes (not zombies) whose environment carries ``run_id``: what a run left."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get("NVTRAIN_RUN_ID") == run_id:
                found.append(proc.pid)
    return found


def store_counters(pod: Pod, port: int) -> dict[str, int]:
    """What the server sockets on ``port`` in ``pod`` (the rendezvous store, hosted by pod 0's
    ft_launcher) have received and sent so far, summed over their connections (``ss -ti``)."""
    argv = ["ip", "netns", "exec", pod.ns, "ss", "-tinH", "state", "established", f"( sport = :{port} )"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False).stdout
    totals = {"connections": 0, "bytes_received": 0, "bytes_sent": 0, "data_segs_in": 0, "data_segs_out": 0}
    for line in out.splitlines():
        if line and not line[0].isspace():
            totals["connections"] += 1
        for key in ("bytes_received", "bytes_sent", "data_segs_in", "data_segs_out"):
            for field in line.split():
                if field.startswith(f"{key}:"):
                    totals[key] += int(field.split(":", 1)[1])
    return totals


# --------------------------------------------------------------------------- one run


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, cluster: Cluster, tail: EventsTail
) -> Any:
    """Poll ``predicate`` (after reading new events) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        tail.poll()
        value = predicate()
        if value:
            return value
        dead = [p for p in cluster.pods.values() if not p.gone and p.returncode() is not None]
        if dead:
            codes = ", ".join(f"pod {p.index}: {p.returncode()}" for p in dead)
            raise Failed(f"waiting for {what}: a pod's nvtrain run exited ({codes})")
        if time.monotonic() > deadline:
            raise Failed(f"gave up after {timeout:.0f} s waiting for {what} (last step {max_step(tail)})")
        time.sleep(0.25)


def first_step_times(steps: list[Step], ranks: int) -> tuple[float, float] | None:
    """(first step, the time by which every rank had a step) or None before every rank did."""
    first: dict[Any, float] = {}
    for e in sorted(steps, key=lambda e: e.ts):
        first.setdefault(e.rank, e.ts)
    if len(first) < ranks:
        return None
    return min(first.values()), max(first.values())


def pod_of(record: Event) -> int:
    """The pod an event came from: its ``host`` (``<job>-<i>``, the pod's hostname; worker events
    carry no ``node``), else its ``node``, else -1."""
    host = record.host or ""
    if host.startswith(f"{JOB}-") and host[len(JOB) + 1 :].isdigit():
        return int(host[len(JOB) + 1 :])
    return record.node if record.node is not None else -1


def log_by_pod(run_dir: Path, start: float, end: float) -> dict[int, dict[str, int]]:
    """Lines and bytes of the run's events logs (every pod's) per pod, for events with
    ``start < ts <= end``."""
    out: dict[int, dict[str, int]] = {}
    for path in pod_files(run_dir):
        with path.open("rb") as handle:
            for line in handle:
                record = parse_event(line)
                if record is not None and start < record.ts <= end:
                    row = out.setdefault(pod_of(record), {"lines": 0, "bytes": 0})
                    row["lines"] += 1
                    row["bytes"] += len(line)
    return dict(sorted(out.items()))


def step_ts(tail: EventsTail, step: int) -> float | None:
    """When ``step`` was first completed by any rank (steps that are logged: multiples of 10,
    saves, first steps of an attempt)."""
    times = [e.ts for e in _steps(tail.events) if e.step == step]
    return min(times) if times else None


def one_run(nodes: int, repeat: int, opts: argparse.Namespace, root: Path) -> dict[str, Any]:
    workdir = root / f"n{nodes:02d}-r{repeat}"
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = f"scale-n{nodes}-r{repeat}-{secrets.token_hex(3)}"
    checkpoints = workdir / "checkpoints"
    policy = workdir / "policy.toml"
    policy.write_text(policy_text(opts, nodes, checkpoints))
    run_dir = checkpoints / run_id  # every pod's events log: events-node<N>.jsonl
    tail = EventsTail(run_dir)
    victim = nodes - 1
    slow = opts.timeout_per_pod * nodes  # every pod's torch import shares the same 2 cores
    result: dict[str, Any] = {
        "pods": nodes,
        "repeat": repeat,
        "run_id": run_id,
        "workdir": str(workdir),
        "loadavg_start": os.getloadavg(),
    }
    cluster = Cluster(workdir / "cluster", job=JOB)
    try:
        cluster.start()
        result["firewall_opened"] = cluster.firewall_opened
        pods = [cluster.create_pod(i) for i in range(nodes)]
        for pod in pods:
            cluster.publish(pod)
        argv = [sys.executable, "-m", "nvtrain", "run", str(policy)]

        # 1. start-up ------------------------------------------------------------------------
        t0 = time.time()
        for pod in pods:
            cluster.run_pod(pod, argv, run_id=run_id)
        result["start_spread_s"] = round(time.time() - t0, 3)
        first = wait_for(
            lambda: first_step_times(_steps(tail.events), nodes),
            opts.timeout + slow,
            "every rank's first step",
            cluster,
            tail,
        )
        windows = {"startup": (t0, first[0])}
        result["first_step_s"] = round(first[0] - t0, 3)
        result["first_step_all_ranks_s"] = round(first[1] - t0, 3)
        result["startup_milestones"] = milestones(tail, t0, first[0])
        log(f"  n={nodes} r={repeat}: first step after {result['first_step_s']:.1f} s")

        # 2. steady state --------------------------------------------------------------------
        base = wait_for(lambda: max_step(tail) or None, 60, "a step", cluster, tail)
        a = (base // opts.interval + 1) * opts.interval  # a save step: logged by every rank
        b = a + opts.window
        wait_for(lambda: step_ts(tail, a), opts.timeout + slow, f"step {a}", cluster, tail)
        store_a = (time.time(), store_counters(cluster.pods[0], STORE_PORT))
        samples = [{p.index: pod_memory(p) for p in cluster.pods.values()}]
        gap = max(2.0, opts.window * opts.step_time / max(opts.mem_samples, 1))
        next_sample = time.monotonic() + gap
        deadline = time.monotonic() + opts.timeout + slow + opts.window * 10
        while step_ts(tail, b) is None:
            if len(samples) < opts.mem_samples and time.monotonic() >= next_sample:
                samples.append({p.index: pod_memory(p) for p in cluster.pods.values()})
                next_sample = time.monotonic() + gap
            if time.monotonic() > deadline:
                raise Failed(f"steady state: step {b} not reached (last step {max_step(tail)})")
            time.sleep(0.25)
            wait_for(lambda: True, 1, "", cluster, tail)  # reads new events, checks the pods
        store_b = (time.time(), store_counters(cluster.pods[0], STORE_PORT))
        ta, tb = step_ts(tail, a), step_ts(tail, b)
        assert ta is not None and tb is not None
        seconds = store_b[0] - store_a[0]
        result["store_traffic"] = {
            "seconds": round(seconds, 2),
            "connections": store_b[1]["connections"],
            **{
                f"{k}_per_s": round((store_b[1][k] - store_a[1][k]) / seconds, 1)
                for k in store_a[1]
                if k != "connections"
            },
        }
        per_node = log_by_pod(run_dir, ta, tb)
        span = tb - ta
        result["steady"] = {
            "from_step": a,
            "to_step": b,
            "seconds": round(span, 3),
            "step_s": round(span / opts.window, 4),
            "events_by_pod": per_node,
            "lines_per_pod_per_step": round(
                statistics.median(v["lines"] for v in per_node.values()) / opts.window, 4
            ),
            "bytes_per_pod_per_step": round(
                statistics.median(v["bytes"] for v in per_node.values()) / opts.window, 1
            ),
            "lines_per_pod_per_min": round(
                statistics.median(v["lines"] for v in per_node.values()) / span * 60, 2
            ),
            "bytes_per_pod_per_min": round(
                statistics.median(v["bytes"] for v in per_node.values()) / span * 60, 1
            ),
        }
        result["memory_samples"] = samples
        result["memory_per_pod"] = summarize_memory(samples)
        log(
            f"  n={nodes} r={repeat}: steady {result['steady']['step_s']:.3f} s/step, "
            f"PSS {result['memory_per_pod']['pss']:.0f} MiB/pod"
        )

        # 3. SIGKILL of pod N-1's worker ------------------------------------------------------
        old = stepping_pids(tail)
        workers = pod_processes(cluster.pods[victim])["worker"]
        if len(workers) != 1:
            raise Failed(f"pod {victim} has {len(workers)} worker processes, expected 1")
        worker = workers[0]
        rank = worker.environ().get("RANK")
        t_kill = time.time()
        worker.kill()
        result["sigkill"] = {"pod": victim, "rank": int(rank) if rank else None, "pid": worker.pid}
        nxt = wait_for(
            lambda: first_step_times(new_steps(tail, t_kill, old), nodes),
            opts.timeout + slow,
            "the first step after the SIGKILL",
            cluster,
            tail,
        )
        windows["sigkill"] = (t_kill, nxt[0])
        result["sigkill"].update(
            recovery_s=round(nxt[0] - t_kill, 3),
            recovery_all_ranks_s=round(nxt[1] - t_kill, 3),
            milestones=milestones(tail, t_kill, nxt[0]),
        )
        log(f"  n={nodes} r={repeat}: SIGKILL recovered in {result['sigkill']['recovery_s']:.1f} s")
        settle = max_step(tail) + 10
        wait_for(lambda: max_step(tail) >= settle, opts.timeout + slow, f"step {settle}", cluster, tail)

        # 4. pod N-1 lost, replaced ------------------------------------------------------------
        old = stepping_pids(tail)
        t_kill = time.time()
        cluster.kill_pod(victim)
        killed_s = time.time() - t_kill
        time.sleep(max(0.0, t_kill + opts.down - time.time()))
        t_new = time.time()
        cluster.start_nvtrain(victim, policy, run_id=run_id, publish=True)
        nxt = wait_for(
            lambda: first_step_times(new_steps(tail, t_kill, old), nodes),
            opts.timeout + slow,
            "the first step after the pod loss",
            cluster,
            tail,
        )
        windows["pod_loss"] = (t_kill, nxt[0])
        result["pod_loss"] = {
            "pod": victim,
            "kill_s": round(killed_s, 3),
            "replacement_started_s": round(t_new - t_kill, 3),
            "recovery_s": round(nxt[0] - t_kill, 3),
            "recovery_all_ranks_s": round(nxt[1] - t_kill, 3),
            "replacement_to_step_s": round(nxt[0] - t_new, 3),
            "milestones": milestones(tail, t_kill, nxt[0]),
        }
        log(f"  n={nodes} r={repeat}: pod loss recovered in {result['pod_loss']['recovery_s']:.1f} s")
        settle = max_step(tail) + 10
        wait_for(lambda: max_step(tail) >= settle, opts.timeout + slow, f"step {settle}", cluster, tail)

        # the whole run's log ----------------------------------------------------------------
        tail.poll()
        whole = log_by_pod(run_dir, 0, float("inf"))
        result["log"] = {
            "lines": sum(v["lines"] for v in whole.values()),
            "bytes": sum(v["bytes"] for v in whole.values()),
            "by_pod": whole,
            "last_step": max_step(tail),
            "seconds": round(time.time() - t0, 1),
            "relaunches": len(tail.of(Relaunch)),
            "launcher_errors": len(tail.of(LauncherError)),
        }
        result["console_log_bytes"] = {
            f"{p.index}.g{p.generation}": p.log_path.stat().st_size for p in cluster.history
        }
        result["dns_queries"] = dns_queries(cluster.dns_log, windows)
        result["log"]["lines_per_pod_in"] = {
            name: statistics.median(v["lines"] for v in log_by_pod(run_dir, *span).values())
            for name, span in windows.items()
        }
        result["ok"] = True
    except Failed as exc:
        result["ok"] = False
        result["error"] = str(exc)
        log(f"  n={nodes} r={repeat}: FAILED: {exc}")
        result["pods_tail"] = cluster.describe(tail=30)[-20000:]
    finally:
        with signals_blocked():
            cluster.close()
        result["leftovers"] = leftovers(cluster, run_id)
        result["loadavg_end"] = os.getloadavg()
    return result


def dns_queries(path: Path, windows: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Queries dnsmasq answered: in all, by type, by querying address, and within each window
    (dnsmasq stamps its log to the second, so a window is widened to whole seconds)."""
    year = time.localtime().tm_year
    out: dict[str, Any] = {"queries": 0, "by_type": {}, "by_client": {}, "in": dict.fromkeys(windows, 0)}
    with contextlib.suppress(OSError), path.open(errors="replace") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) < 8 or not parts[4].startswith("query["):
                continue
            qtype, client = parts[4][6:-1], parts[7]
            if client.endswith(".1"):  # the driver's own probe from the bridge
                continue
            out["queries"] += 1
            out["by_type"][qtype] = out["by_type"].get(qtype, 0) + 1
            out["by_client"][client] = out["by_client"].get(client, 0) + 1
            with contextlib.suppress(ValueError):
                stamp = datetime.datetime.strptime(f"{year} {' '.join(parts[:3])}", "%Y %b %d %H:%M:%S")
                ts = stamp.timestamp()
                for name, (start, end) in windows.items():
                    if int(start) <= ts <= end:
                        out["in"][name] += 1
    return out


def leftovers(cluster: Cluster, run_id: str) -> dict[str, Any]:
    return {
        "processes": run_id_processes(run_id),
        "namespaces": [ns for ns in list_namespaces() if ns.startswith(f"nvt-{cluster.tag}")],
        "dnsmasq_running": cluster.dnsmasq is not None and cluster.dnsmasq.poll() is None,
    }


def summarize_memory(samples: list[dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """Median over samples and pods of each pod's sums, and of each kind's."""
    pods = [pod for sample in samples for pod in sample.values()]
    out: dict[str, Any] = {}
    for key in ("rss", "pss", "uss"):
        out[key] = round(statistics.median(p[key] for p in pods), 1) if pods else None
    kinds = sorted({k for p in pods for k in p["by_kind"]})
    out["by_kind"] = {
        k: {
            key: round(statistics.median(p["by_kind"][k][key] for p in pods if k in p["by_kind"]), 1)
            for key in ("rss", "pss", "uss")
        }
        for k in kinds
    }
    out["processes"] = statistics.median(p["processes"] for p in pods) if pods else None
    return out


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """Tear-down is not interrupted by a second Ctrl-C or SIGTERM."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# --------------------------------------------------------------------------- summary


def median(values: list[float | None]) -> float | None:
    return stats.median(values, 3)


def _get(run: dict[str, Any], path: str) -> Any:
    value: Any = run
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


METRICS = {
    "first_step_s": "first_step_s",
    "first_step_all_ranks_s": "first_step_all_ranks_s",
    "startup.launcher_start": "startup_milestones.launcher_start",
    "startup.dns_resolved": "startup_milestones.dns_resolved",
    "startup.launcher_started": "startup_milestones.launcher_started",
    "startup.rendezvous_done": "startup_milestones.rendezvous_done",
    "startup.worker_start": "startup_milestones.worker_start",
    "sigkill_s": "sigkill.recovery_s",
    "sigkill_all_ranks_s": "sigkill.recovery_all_ranks_s",
    "sigkill.worker_failed": "sigkill.milestones.worker_failed",
    "sigkill.rendezvous_done": "sigkill.milestones.rendezvous_done",
    "sigkill.worker_start": "sigkill.milestones.worker_start",
    "pod_loss_s": "pod_loss.recovery_s",
    "pod_loss_all_ranks_s": "pod_loss.recovery_all_ranks_s",
    "pod_loss.replacement_to_step_s": "pod_loss.replacement_to_step_s",
    "pod_loss.rendezvous_done": "pod_loss.milestones.rendezvous_done",
    "pod_loss.worker_start": "pod_loss.milestones.worker_start",
    "step_s": "steady.step_s",
    "rss_mib": "memory_per_pod.rss",
    "pss_mib": "memory_per_pod.pss",
    "uss_mib": "memory_per_pod.uss",
    "lines_per_pod_per_step": "steady.lines_per_pod_per_step",
    "bytes_per_pod_per_step": "steady.bytes_per_pod_per_step",
    "lines_per_pod_per_min": "steady.lines_per_pod_per_min",
    "bytes_per_pod_per_min": "steady.bytes_per_pod_per_min",
    "log_lines_per_pod": "log_lines_per_pod",
    "dns_queries_per_pod": "dns_queries_per_pod",
    "store_rx_bytes_per_s": "store_traffic.bytes_received_per_s",
    "store_tx_bytes_per_s": "store_traffic.bytes_sent_per_s",
    "store_requests_per_s": "store_traffic.data_segs_in_per_s",
    "dns_per_pod_startup": "dns_per_pod_startup",
    "dns_per_pod_sigkill": "dns_per_pod_sigkill",
    "dns_per_pod_pod_loss": "dns_per_pod_pod_loss",
    "log_lines_per_pod_startup": "log.lines_per_pod_in.startup",
    "log_lines_per_pod_sigkill": "log.lines_per_pod_in.sigkill",
    "log_lines_per_pod_pod_loss": "log.lines_per_pod_in.pod_loss",
}


def summarize(runs: list[dict[str, Any]], counts: list[int]) -> dict[str, Any]:
    for run in runs:
        if run.get("ok"):
            run["log_lines_per_pod"] = round(run["log"]["lines"] / run["pods"], 1)
            run["dns_queries_per_pod"] = round(run["dns_queries"]["queries"] / run["pods"], 1)
            for name, count in run["dns_queries"]["in"].items():
                run[f"dns_per_pod_{name}"] = round(count / run["pods"], 1)
    summary: dict[str, Any] = {}
    for n in counts:
        done = [r for r in runs if r["pods"] == n and r.get("ok")]
        row: dict[str, Any] = {
            "runs": len(done),
            "failed": sum(1 for r in runs if r["pods"] == n) - len(done),
        }
        for name, path in METRICS.items():
            row[name] = median([_get(r, path) for r in done])
        kinds = sorted({k for r in done for k in r["memory_per_pod"]["by_kind"]})
        row["pss_by_kind_mib"] = {
            k: median([r["memory_per_pod"]["by_kind"].get(k, {}).get("pss") for r in done]) for k in kinds
        }
        summary[str(n)] = row
    base = next((summary[str(n)] for n in counts if summary[str(n)]["runs"]), None)
    for n in counts:
        row = summary[str(n)]
        row["ratio"] = {
            name: round(row[name] / base[name], 2) if base and row[name] and base[name] else None
            for name in METRICS
        }
    return summary


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(summary: dict[str, Any], counts: list[int]) -> str:
    """The markdown table: medians, and each as a multiple of the smallest pod count's."""
    head = (
        "| pods | runs | first step (s) | SIGKILL -> step (s) | pod lost -> step (s) | replacement start "
        "-> step (s) | step (s) | PSS / pod (MiB) | RSS / pod (MiB) | events / pod / step (lines, B) | "
        "events / pod / min (lines, kB) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for n in counts:
        s, r = summary[str(n)], summary[str(n)]["ratio"]
        show_ratio = n != counts[0]

        def cell(
            name: str, digits: int = 1, s: dict[str, Any] = s, r: dict[str, Any] = r, show: bool = show_ratio
        ) -> str:
            ratio = r.get(name)
            return _f(s[name], digits) + (f" ({ratio:.2f}x)" if ratio and show else "")

        kb = s["bytes_per_pod_per_min"]
        per_step = f"{_f(s['lines_per_pod_per_step'], 3)}, {_f(s['bytes_per_pod_per_step'], 0)}"
        per_min = f"{_f(s['lines_per_pod_per_min'], 1)}, {_f(kb / 1000 if kb else None, 1)}"
        rows.append(
            f"| {n} | {s['runs']} | {cell('first_step_s')} | {cell('sigkill_s')} | {cell('pod_loss_s')} | "
            f"{cell('pod_loss.replacement_to_step_s')} | {cell('step_s', 3)} | {cell('pss_mib', 0)} | "
            f"{cell('rss_mib', 0)} | {per_step} | {per_min} |"
        )
    return head + "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- main


def machine(src: Path) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": host.cpu_model(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "torch": host.version("torch"),
        "nvidia-resiliency-ext": host.version("nvidia-resiliency-ext"),
        "dnsmasq": subprocess.run(["dnsmasq", "--version"], capture_output=True, text=True).stdout.split(
            "\n"
        )[0],
        "repo_head": host.git_head(mark_dirty=False),
        "nvtrain_src": str(src),
        "loadavg_start": os.getloadavg(),
    }


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", default="2,4,8,16", help="pod counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--window", type=int, default=100, help="steady-state steps measured")
    parser.add_argument("--interval", type=int, default=20, help="checkpoint interval (steps)")
    parser.add_argument("--step-time", type=float, default=0.05, help="the demo's sleep per step (s)")
    parser.add_argument("--steps", type=int, default=100000, help="the demo's steps (the driver stops it)")
    parser.add_argument("--collective-timeout", default="60s")
    parser.add_argument("--down", type=float, default=2.0, help="s from a pod's loss to its replacement")
    parser.add_argument("--mem-samples", type=int, default=3)
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="s per phase, plus --timeout-per-pod x pods"
    )
    parser.add_argument("--timeout-per-pod", type=float, default=30.0)
    parser.add_argument(
        "--src", type=Path, default=REPO / "src", help="the nvtrain package to run (its parent)"
    )
    parser.add_argument("--out", type=Path, help="work dir kept for the logs (default: a new temp dir)")
    parser.add_argument("--json", type=Path, help="write every run and the summary here")
    opts = parser.parse_args(argv)
    problem = environment_problem()
    if problem:
        print(f"pods.py: cannot emulate pods here: {problem}", file=sys.stderr)
        return 2
    counts = [int(x) for x in opts.pods.split(",")]
    if not (opts.src / "nvtrain" / "__init__.py").is_file():
        parser.error(f"--src {opts.src}: no nvtrain package there")
    src = opts.src.resolve()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    root = opts.out or Path(tempfile.mkdtemp(prefix="nvtrain-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    info = machine(src)
    info["argv"] = sys.argv
    info["options"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(opts).items()}
    log(f"work dir {root}; load average {info['loadavg_start']}")
    runs: list[dict[str, Any]] = []
    interrupted = False
    try:
        for repeat in range(opts.repeats):  # pod counts interleaved: load from elsewhere hits all alike
            for n in counts:
                log(f"{n} pods, repeat {repeat + 1}/{opts.repeats}")
                runs.append(one_run(n, repeat, opts, root))
                if opts.json:
                    write_json(opts.json, info, runs, counts)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: every cluster of this run has been torn down")
    info["loadavg_end"] = os.getloadavg()
    info["interrupted"] = interrupted
    summary = write_json(opts.json, info, runs, counts) if opts.json else summarize(runs, counts)
    print(table(summary, counts))
    left = [r["leftovers"] for r in runs if any(r["leftovers"].values())]
    if left:
        print(f"LEFT BEHIND: {left}", file=sys.stderr)
    return 1 if interrupted or left or not all(r.get("ok") for r in runs) else 0


def write_json(
    path: Path, info: dict[str, Any], runs: list[dict[str, Any]], counts: list[int]
) -> dict[str, Any]:
    summary = summarize(runs, counts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": info, "summary": summary, "runs": runs}, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    sys.exit(main())

"""What the rendezvous store and DNS cost per node: the figures docs/architecture.md extrapolates
to 1,000+ nodes from ("At 1,000+ nodes: the store and DNS").

Three measurements, each a subcommand (``all`` runs them in turn):

state-size  The rendezvous state that NVRx 0.4.1's ft_launcher keeps in one key of the c10d
            TCPStore (``torch.rendezvous.<run id>``): every node re-reads it (``get``) at each
            agent monitor tick and rewrites it (``compare_set``, old value as the token) at each
            keep-alive. Built with NVRx's own classes for a round of N participants with
            keep-alives and worker states, pickled and base64-encoded as NVRx stores it; also the
            client's time to decode it and encode a change (each write attempt does both).
ops         Latency of ``get`` and ``compare_set`` on values of those sizes, one client against a
            TCPStore server in this process over loopback, for torch's libuv server (the
            default of ``init_process_group``) and the legacy one (what NVRx 0.4.1's rendezvous
            store uses: it passes ``use_libuv`` false unless the rendezvous config sets it).
ptr         Reverse DNS per store connection: a TCPStore server in one network-namespace pod
            and clients in another (``tests/launcher/multinode/netns_pods.py``, dnsmasq serving PTR
            records); counts the PTR queries each side sends for ``--connections`` stores opened
            by one client process, then makes the client's resp. the server's resolver
            unreachable (timeout 1 s, 2 attempts) and times the connections.
startup-ptr The whole job: ``--pods`` pods start `nvtrain run` (``pods.py``'s policy) with pod
            0's resolver working and unreachable, alternating, ``--pairs`` times; time to the
            first step and the launcher milestones. Pod 0 hosts both stores (the rendezvous
            store in its ft_launcher, the workers' store in rank 0) and reverse-resolves every
            peer that connects: does an unanswered lookup hold the stores up?

    .venv/bin/python benchmarks/scale/store_probe.py all --json benchmarks/scale/results/store-probe.json
    .venv/bin/python benchmarks/scale/store_probe.py startup-ptr --pods 8 --pairs 3 \
        --json benchmarks/scale/results/startup-ptr.json
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
NODES = [2, 4, 8, 16, 128, 1000, 2000, 4000]


# --------------------------------------------------------------------------- state size


def state_size(nodes: list[int]) -> list[dict[str, Any]]:
    from nvidia_resiliency_ext.fault_tolerance._ft_rendezvous import _NodeDesc, _RendezvousState
    from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.agent.server.api import WorkerState

    rows = []
    for n in nodes:
        state = _RendezvousState()
        state.round, state.complete = 3, True
        now = datetime.utcnow()
        for i in range(n):
            # --local-addr is the pod IP; pids of a few digits, as in a pod
            node = _NodeDesc(f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", 100 + i % 50, 0)
            state.participants[node] = i
            state.last_heartbeats[node] = now - timedelta(seconds=i % 5)
            state.worker_states[node] = WorkerState.HEALTHY
        raw = pickle.dumps(state)
        stored = base64.b64encode(raw)
        # What a node does with the state on every attempt to write it: decode the state it got
        # back, re-encode its change (NVRx's sync: b64decode + unpickle, pickle + b64encode).
        times = []
        for _ in range(max(3, 2000 // n)):
            start = time.perf_counter()
            base64.b64encode(pickle.dumps(pickle.loads(base64.b64decode(stored))))
            times.append(time.perf_counter() - start)
        rows.append(
            {
                "nodes": n,
                "pickled_bytes": len(raw),
                "stored_bytes": len(stored),
                "decode_encode_ms": round(statistics.median(times) * 1000, 3),
            }
        )
    return rows


# --------------------------------------------------------------------------- store ops


def store_ops(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    import torch.distributed as dist

    rows = []
    for libuv in (True, False):
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=libuv, wait_for_workers=False)
        client = dist.TCPStore("127.0.0.1", server.port, is_master=False, use_libuv=libuv)
        for size in sizes:
            value = b"x" * size
            client.set("k", value)
            get_times, cas_times = [], []
            for i in range(repeats):
                start = time.perf_counter()
                current = client.get("k")
                get_times.append(time.perf_counter() - start)
                new = (b"y" if i % 2 else b"x") * size
                start = time.perf_counter()
                client.compare_set("k", current, new)  # succeeds: the token is the current value
                cas_times.append(time.perf_counter() - start)
            rows.append(
                {
                    "server": "libuv" if libuv else "legacy",
                    "value_bytes": size,
                    "get_ms": round(statistics.median(get_times) * 1000, 3),
                    "compare_set_ms": round(statistics.median(cas_times) * 1000, 3),
                }
            )
        del client, server
    return rows


# --------------------------------------------------------------------------- reverse DNS

_SERVER = """
import sys, time, torch.distributed as dist
store = dist.TCPStore("0.0.0.0", int(sys.argv[1]), is_master=True, use_libuv=sys.argv[2] == "1",
                      wait_for_workers=False)
print("LISTENING", flush=True)
time.sleep(float(sys.argv[3]))
"""

_CLIENTS = """
import json, sys, time, torch.distributed as dist
from datetime import timedelta
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times, keep = [], []
for i in range(count):
    start = time.perf_counter()
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=120))
    store.set(f"client{i}", "1")
    times.append(round(time.perf_counter() - start, 3))
    keep.append(store)
print("RESULT " + json.dumps(times), flush=True)
"""


def _ptr_count(log: Path, client: str) -> int:
    if not log.exists():
        return 0
    lines = log.read_text().splitlines()
    return sum(1 for line in lines if "query[PTR]" in line and line.endswith(f" from {client}"))


def _run_case(cluster: Any, libuv: bool, count: int, blackhole: str | None, port: int) -> dict[str, Any]:
    server, client = cluster.create_pod(0), cluster.create_pod(1)
    dead = f"{cluster.subnet}.250"  # nobody has this address: queries to it go unanswered
    for pod, role in ((server, "server"), (client, "client")):
        if blackhole == role:  # this pod's resolver asks an address nobody answers from
            (Path("/etc/netns") / pod.ns / "resolv.conf").write_text(
                f"nameserver {dead}\noptions timeout:1 attempts:2\n"
            )
    log = cluster.dns_log
    before = {p.address: _ptr_count(log, p.address) for p in (server, client)}
    cluster.run_pod(
        server, [sys.executable, "-c", _SERVER, str(port), "1" if libuv else "0", "600"], run_id="probe"
    )
    deadline = time.monotonic() + 120
    while "LISTENING" not in server.log():
        if time.monotonic() > deadline or server.returncode() is not None:
            raise RuntimeError(f"store server did not start:\n{server.log()}")
        time.sleep(0.2)
    argv = [
        "ip",
        "netns",
        "exec",
        client.ns,
        sys.executable,
        "-c",
        _CLIENTS,
        server.address,
        str(port),
        str(count),
    ]
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, check=False)
    times = next((json.loads(x[7:]) for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    time.sleep(1.5)  # dnsmasq logs asynchronously
    after = {p.address: _ptr_count(log, p.address) for p in (server, client)}
    for pod in (server, client):
        cluster.kill_pod(pod.index)
    return {
        "server_backend": "libuv" if libuv else "legacy",
        "resolver_unreachable": blackhole or "none",
        "connections": count,
        "connect_s": times,
        "connect_median_s": statistics.median(times) if times else None,
        "ptr_queries_from_server": after[server.address] - before[server.address],
        "ptr_queries_from_client": after[client.address] - before[client.address],
        "error": None if times else proc.stderr[-2000:],
    }


def reverse_dns(count: int) -> list[dict[str, Any]]:
    sys.path.insert(0, str(REPO / "tests" / "launcher" / "multinode"))
    from netns_pods import Cluster, environment_problem

    problem = environment_problem()
    if problem:
        return [{"skipped": problem}]
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="nvtrain-store-probe-") as tmp,
        Cluster(Path(tmp), job="probe") as cluster,
    ):
        port = 29600
        for libuv in (True, False):
            for blackhole in (None, "client", "server"):
                port += 1
                rows.append(_run_case(cluster, libuv, count, blackhole, port))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def startup_ptr(pods: int, pairs: int, src: Path) -> list[dict[str, Any]]:
    sys.path.insert(0, str(REPO / "tests" / "launcher" / "multinode"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import pods as driver
    from netns_pods import Cluster, environment_problem

    problem = environment_problem()
    if problem:
        return [{"skipped": problem}]
    os.environ["PYTHONPATH"] = str(src)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    opts = argparse.Namespace(steps=100000, step_time=0.05, collective_timeout="60s", interval=20)
    rows = []
    for i in range(pairs):
        for mode in ("answered", "unanswered"):
            with tempfile.TemporaryDirectory(prefix="nvtrain-startup-ptr-") as tmp:
                root = Path(tmp)
                policy = root / "policy.toml"
                policy.write_text(driver.policy_text(opts, pods, root / "checkpoints"))
                run_id = f"ptr-{mode}-{i}"
                with Cluster(root / "cluster", job=driver.JOB) as cluster:
                    members = [cluster.create_pod(k) for k in range(pods)]
                    for pod in members:
                        cluster.publish(pod)
                    if mode == "unanswered":  # pod 0 finds its own name in /etc/hosts; nothing else
                        (Path("/etc/netns") / members[0].ns / "resolv.conf").write_text(
                            f"nameserver {cluster.subnet}.250\noptions timeout:1 attempts:2\n"
                        )
                    tail = driver.EventsTail(root / "checkpoints" / run_id)  # every pod's log
                    start = time.time()
                    for pod in members:
                        cluster.run_pod(
                            pod, [sys.executable, "-m", "nvtrain", "run", str(policy)], run_id=run_id
                        )
                    first = driver.wait_for(
                        lambda tail=tail: driver.first_step_times(driver._steps(tail.events), pods),
                        300 + 30 * pods,
                        "every rank's first step",
                        cluster,
                        tail,
                    )
                    queries = sum(
                        1
                        for line in cluster.dns_log.read_text().splitlines()
                        if " query[" in line and line.endswith(f" from {members[0].address}")
                    )
                    rows.append(
                        {
                            "pod0_resolver": mode,
                            "pods": pods,
                            "first_step_s": round(first[0] - start, 2),
                            "milestones": driver.milestones(tail, start, first[0]),
                            "queries_from_pod0_seen_by_dnsmasq": queries,
                            "loadavg": os.getloadavg(),
                        }
                    )
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("what", choices=["state-size", "ops", "ptr", "startup-ptr", "all"])
    parser.add_argument("--pods", type=int, default=8, help="startup-ptr: pods per run")
    parser.add_argument("--pairs", type=int, default=3, help="startup-ptr: runs per resolver mode")
    parser.add_argument("--src", type=Path, default=REPO / "src", help="startup-ptr: the nvtrain to run")
    parser.add_argument("--nodes", default=",".join(map(str, NODES)))
    parser.add_argument("--repeats", type=int, default=50, help="ops: operations per size")
    parser.add_argument("--connections", type=int, default=4, help="ptr: store connections per case")
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args(argv)
    nodes = [int(x) for x in opts.nodes.split(",")]
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": os.getloadavg()}
    if opts.what in ("state-size", "ops", "all"):
        out["state_size"] = state_size(nodes)
        print(textwrap.indent(json.dumps(out["state_size"], indent=1), "  "))
    if opts.what in ("ops", "all"):
        sizes = sorted({1024, *(row["stored_bytes"] for row in out["state_size"])})
        out["ops"] = store_ops(sizes, opts.repeats)
        print(textwrap.indent(json.dumps(out["ops"], indent=1), "  "))
    if opts.what in ("ptr", "all"):
        out["ptr"] = reverse_dns(opts.connections)
    if opts.what == "startup-ptr":
        out["startup_ptr"] = startup_ptr(opts.pods, opts.pairs, opts.src.resolve())
    out["loadavg_end"] = os.getloadavg()
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

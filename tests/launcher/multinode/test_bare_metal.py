"""``nvtrain run`` across nodes off Kubernetes, each node a network namespace reached by its
address: torchrun's flags on bare metal (``--nnodes``, ``--node-rank``, ``--master-addr`` /
``--master-port``, ``--rdzv-endpoint``), and Slurm's variables as ``srun`` sets them (node
names from each node's ``/etc/hosts``, as on a cluster without DNS for its nodes). No DNS
record is published, and the cluster's dnsmasq log shows no node asking for an address.

The job is a plain torchrun script (``tests/support/bin``), cold workers (one per node: a warm
start would cost as much CPU as it saves), under NVRx's real ft_launcher; the recovery and the
events are those of a Kubernetes job (an in-job restart after a SIGKILL, ``rendezvous_done`` of
every node, ``launcher_exit`` 0 everywhere).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from netns_pods import NETNS_ETC, Cluster, Pod

from nvtrain.runlog import pod_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

BIN = Path(__file__).resolve().parents[2] / "support" / "bin"
PORT = 29400
BUDGET = 120.0
"""Seconds each test may run before it gives up with every node's log (below the timeout)."""

NOT_A_POD = {"JOB_COMPLETION_INDEX": "", "POD_IP": "", "NVTRAIN_RUN_ID": "", "KUBERNETES_SERVICE_HOST": ""}
"""What ``Cluster.run_pod`` gives a pod, taken away: these nodes are no Kubernetes pods."""


def write_policy(tmp_path: Path) -> tuple[Path, Path]:
    """A policy of settings only (no script: the command line names it), and the run folder
    every node shares."""
    policy = tmp_path / "settings.toml"
    policy.write_text(
        f"""\
[job]
name = "bm"
stop_timeout = "5s"
collective_timeout = "10s"
warm_start = false

[rendezvous]
join_timeout = "60s"
dns_timeout = "20s"

[heartbeat]
initial_timeout = "60s"
timeout = "20s"
monitor_interval = "1s"

[restart.in_process]
enabled = false

[restart.in_job]
max_restarts = 2

[checkpoint]
dir = "{tmp_path / "ckpt"}"
""",
        encoding="utf-8",
    )
    return policy, tmp_path / "ckpt"


def start_nodes(cluster: Cluster, count: int, argv_of: Any, env_of: Any = None) -> list[Pod]:
    pods = [cluster.create_pod(i) for i in range(count)]
    for pod in pods:
        argv = [sys.executable, "-m", "nvtrain", "run", *argv_of(pod, pods)]
        env = {**NOT_A_POD, **(env_of(pod, pods) if env_of else {})}
        cluster.run_pod(pod, argv, env=env, run_id="")
    return pods


def wait_exit(cluster: Cluster, pods: list[Pod], deadline: float) -> dict[int, int | None]:
    while time.monotonic() < deadline and any(p.returncode() is None for p in pods):
        time.sleep(0.2)
    codes = {p.index: p.returncode() for p in pods}
    assert all(code is not None for code in codes.values()), f"still running\n{cluster.describe()}"
    return codes


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    events = []
    for path in pod_files(run_dir):
        for line in path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return sorted(events, key=lambda event: float(event["ts"]))


def named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == name]


def no_name_looked_up(cluster: Cluster, pods: list[Pod]) -> None:
    """No node asked DNS for a name's address: every peer was reached by address (or through
    /etc/hosts). Reverse lookups of peers' addresses (c10d and gloo ask for a peer's name, and
    carry on without one) do not count."""
    log = cluster.dns_log.read_text(errors="replace") if cluster.dns_log.exists() else ""
    nodes = {pod.address for pod in pods}
    asked = [
        line
        for line in log.splitlines()
        if re.search(r"query\[(A|AAAA)\]", line) and line.rsplit(" from ", 1)[-1].strip() in nodes
    ]
    assert not asked, "a node asked DNS for an address:\n" + "\n".join(asked[:20])


def all_logs(pods: list[Pod]) -> str:
    return "\n".join(pod.log() for pod in pods)


def test_two_nodes_by_master_addr_recover_from_a_sigkill(cluster: Cluster, tmp_path: Path) -> None:
    """torchrun's bare-metal command line, node 1's worker SIGKILLs itself at step 2: ft_launcher
    restarts the workers of both nodes (in-job), and the job finishes on both."""
    policy, run_root = write_policy(tmp_path)
    deadline = time.monotonic() + BUDGET

    def argv(pod: Pod, pods: list[Pod]) -> list[str]:
        return [
            "--policy", str(policy), "--nnodes", "2", "--node-rank", str(pod.index),
            "--master-addr", pods[0].address, "--master-port", str(PORT), "--rdzv-id", "bm-two",
            str(BIN / "sigkill_worker.py"), "--steps", "4", "--kill-rank", "1", "--kill-step", "2",
        ]  # fmt: skip

    pods = start_nodes(cluster, 2, argv)
    codes = wait_exit(cluster, pods, deadline)
    assert codes == {0: 0, 1: 0}, f"exit codes {codes}\n{cluster.describe()}"
    text = all_logs(pods)
    assert "WORKER SIGKILL rank=1 step=2" in text, cluster.describe()
    # Both nodes' workers started again (TORCHELASTIC_RESTART_COUNT counts a launcher's own
    # restarts: node 0's stays 0) and finished.
    assert text.count("WORKER START rank=0") == 2 and "WORKER DONE rank=1 restart=1" in text, (
        cluster.describe()
    )
    assert "WORKER DONE rank=0" in text, cluster.describe()
    events = read_events(run_root / "bm-two")
    failed = named(events, "worker_failed")
    assert any(e.get("node") == 1 and e.get("signal") == "SIGKILL" for e in failed), failed
    assert any(e.get("layer") == "in_job" for e in named(events, "restart_begin")), events
    rounds = named(events, "rendezvous_done")
    seen = f"{sorted({(e['node'], e['event']) for e in events})}\n{cluster.describe()}"
    assert {e["node"] for e in rounds} == {0, 1}, seen
    assert all(e.get("nodes") == 2 for e in rounds), rounds
    resolved = named(events, "dns_resolved")
    assert {e["node"] for e in resolved} == {0, 1}, resolved
    assert all(e.get("addresses") == [pods[0].address] for e in resolved), resolved
    starts = named(events, "launcher_start")
    assert {e.get("endpoint") for e in starts} == {f"{pods[0].address}:{PORT}"}, starts
    assert [e.get("exit_code") for e in named(events, "launcher_exit")] == [0, 0]
    no_name_looked_up(cluster, pods)


def test_four_nodes_by_rdzv_endpoint(cluster: Cluster, tmp_path: Path) -> None:
    """Four nodes, ``--rdzv-endpoint ADDR:PORT`` and ``NVTRAIN_NODE_RANK``; each node gives its
    peers its own address on the route to node 0."""
    policy, run_root = write_policy(tmp_path)
    deadline = time.monotonic() + BUDGET

    def argv(pod: Pod, pods: list[Pod]) -> list[str]:
        return [
            "--policy", str(policy), "--nnodes=4", f"--rdzv-endpoint={pods[0].address}:{PORT}",
            "--rdzv-backend=c10d", "--rdzv-id=bm-four", str(BIN / "ddp_train.py"), "--steps", "3",
        ]  # fmt: skip

    pods = start_nodes(cluster, 4, argv, lambda pod, _: {"NVTRAIN_NODE_RANK": str(pod.index)})
    codes = wait_exit(cluster, pods, deadline)
    assert codes == {0: 0, 1: 0, 2: 0, 3: 0}, f"exit codes {codes}\n{cluster.describe()}"
    done = re.findall(r"DDP DONE RANK=(\d) steps=3 weight=(\S+)", all_logs(pods))
    assert sorted(rank for rank, _ in done) == ["0", "1", "2", "3"], cluster.describe()
    assert len({weight for _, weight in done}) == 1, done
    events = read_events(run_root / "bm-four")
    rounds = named(events, "rendezvous_done")
    seen = f"{sorted({(e['node'], e['event']) for e in events})}\n{cluster.describe()}"
    assert {e["node"] for e in rounds} == {0, 1, 2, 3}, seen
    assert all(e.get("nodes") == 4 for e in rounds), rounds
    for pod in pods:  # the address each node published: its own (--local-addr)
        argv_line = next(e["argv"] for e in named(events, "launcher_start") if e["node"] == pod.index)
        assert f"--local-addr={pod.address}" in argv_line, argv_line
    no_name_looked_up(cluster, pods)


def test_two_nodes_under_slurms_variables(cluster: Cluster, tmp_path: Path) -> None:
    """``srun -N2 --ntasks-per-node=1 nvtrain run --policy FILE train.py``: the node rank, the
    node count, the store's host (the node list's first name) and the run id from Slurm's
    variables; the node names resolve through each node's /etc/hosts."""
    policy, run_root = write_policy(tmp_path)
    deadline = time.monotonic() + BUDGET
    pods = [cluster.create_pod(i) for i in range(2)]
    hostnames = [f"node0{pod.index + 1}" for pod in pods]  # the node list: node[01-02]
    for pod in pods:  # every node's /etc/hosts lists the cluster's nodes
        hosts = NETNS_ETC / pod.ns / "hosts"
        extra = "".join(f"{p.address}\t{name}\n" for p, name in zip(pods, hostnames, strict=True))
        hosts.write_text(hosts.read_text() + extra)
    for pod in pods:
        env = {
            **NOT_A_POD,
            "SLURM_JOB_ID": "5150",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_NNODES": "2",
            "SLURM_JOB_NODELIST": "node[01-02]",
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_NUM_NODES": "2",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_NODELIST": "node[01-02]",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
            "SLURM_TASKS_PER_NODE": "1(x2)",
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_NODEID": str(pod.index),
            "SLURM_PROCID": str(pod.index),
            "SLURM_LOCALID": "0",
            "SLURMD_NODENAME": hostnames[pod.index],
        }
        argv = [sys.executable, "-m", "nvtrain", "run", "--policy", str(policy)]
        cluster.run_pod(pod, [*argv, str(BIN / "ddp_train.py"), "--steps", "2"], env=env, run_id="")
    codes = wait_exit(cluster, pods, deadline)
    assert codes == {0: 0, 1: 0}, f"exit codes {codes}\n{cluster.describe()}"
    done = re.findall(r"DDP DONE RANK=(\d)", all_logs(pods))
    assert sorted(done) == ["0", "1"], cluster.describe()
    events = read_events(run_root / "bm-slurm-5150")
    starts = named(events, "launcher_start")
    assert {e.get("endpoint") for e in starts} == {"node01:29500"}, starts
    assert {e["node"]: e.get("is_host") for e in starts} == {0: True, 1: False}, starts
    resolved = named(events, "dns_resolved")
    assert {e["node"]: tuple(e.get("addresses") or ()) for e in resolved} == {
        0: (pods[0].address,),
        1: (pods[0].address,),
    }, resolved
    seen = f"{sorted({(e['node'], e['event']) for e in events})}\n{cluster.describe()}"
    assert {e["node"] for e in named(events, "rendezvous_done")} == {0, 1}, seen
    no_name_looked_up(cluster, pods)

"""The emulated cluster itself: pod network, DNS records that change at run time, teardown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from netns_pods import NETNS_ETC, Cluster, _links, list_namespaces, namespace_pids

from support.waiting import wait_until

MULTINODE = Path(__file__).resolve().parent

pytestmark = pytest.mark.slow

_ECHO_SERVER = """
import socket
s = socket.socket()
s.bind(("0.0.0.0", 5555))
s.listen()
print("listening", flush=True)
conn, peer = s.accept()
conn.sendall(socket.gethostname().encode())
conn.close()
"""

_ECHO_CLIENT = """
import socket, sys
print(socket.gethostname(), socket.gethostbyname(socket.gethostname()))
with socket.create_connection((sys.argv[1], 5555), timeout=5) as s:
    print("peer", s.recv(100).decode())
"""

# Another test process sweeping what dead runs left, as each one does when it sets up a cluster;
# it says "sweeping" after its first sweep and stops when the file named by argv[2] exists.
_SWEEPER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from netns_pods import cleanup_stale
stop = Path(sys.argv[2])
cleanup_stale()
print("sweeping", flush=True)
sweeps = 1
while not stop.exists():
    cleanup_stale()
    sweeps += 1
print("swept", sweeps, flush=True)
"""


def _wait_for(predicate, timeout: float, what: str) -> None:
    wait_until(predicate, timeout, what, interval=0.1)


def test_dns_records_change_at_run_time(cluster: Cluster) -> None:
    pod = cluster.create_pod(0)
    name = cluster.pod_name(1)
    assert cluster.lookup(name, pod.ns) == [], "unknown name must be NXDOMAIN"

    cluster.set_record("pod-1", [(f"{cluster.subnet}.50", name)])
    _wait_for(lambda: cluster.lookup(name, pod.ns) == [f"{cluster.subnet}.50"], 5, "record to appear")

    cluster.set_record("pod-1", [(f"{cluster.subnet}.51", name)])
    _wait_for(lambda: cluster.lookup(name, pod.ns) == [f"{cluster.subnet}.51"], 5, "record to change")

    cluster.remove_record("pod-1")
    _wait_for(lambda: cluster.lookup(name, pod.ns) == [], 5, "record to disappear")

    # Nothing outside the cluster domain is forwarded anywhere.
    assert cluster.lookup("example.com", pod.ns) == []
    log = cluster.dns_log.read_text()
    assert "forwarded" not in log, log
    assert "inotify" in log, log


def test_pods_reach_each_other_and_resolve_their_own_hostname(cluster: Cluster) -> None:
    server, client = cluster.create_pod(0), cluster.create_pod(1)
    cluster.run_pod(server, [sys.executable, "-c", _ECHO_SERVER], run_id="echo")
    _wait_for(lambda: "listening" in server.log(), 20, f"echo server\n{cluster.describe()}")
    proc = subprocess.run(
        ["ip", "netns", "exec", client.ns, "unshare", "--uts", "--", "sh", "-c",
         f'hostname {client.hostname} && exec "$0" "$@"', sys.executable, "-c", _ECHO_CLIENT,
         server.address],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"pod 1 cannot reach pod 0 over the bridge: {proc.stderr}\n"
        "(is br_netfilter loaded with an iptables FORWARD policy of DROP? "
        "try `sysctl net.bridge.bridge-nf-call-iptables=0`)"
    )
    assert proc.stdout.split() == [client.hostname, client.address, "peer", server.hostname]
    assert server.popen is not None
    assert server.popen.wait(timeout=10) == 0


def test_kill_pod_kills_everything_in_it_and_teardown_removes_all(netns_available: None, tmp_path) -> None:
    with Cluster(tmp_path / "cluster", job="trainer") as cluster:
        pod = cluster.create_pod(0)
        cluster.publish(pod)
        # A process tree with a grandchild in another session: all of it must die.
        script = "import subprocess, time; subprocess.Popen(['setsid', 'sleep', '300']); time.sleep(300)"
        cluster.run_pod(pod, [sys.executable, "-c", script], run_id="sleep")
        _wait_for(lambda: len(namespace_pids(pod.ns)) >= 2, 20, "the process tree")
        other = cluster.create_pod(1)
        assert cluster.lookup(cluster.pod_name(0), other.ns) == [pod.address]
        bridge_mac = Path(f"/sys/class/net/{cluster.bridge}/address").read_text()
        cluster.kill_pod(0)
        assert pod.ns not in list_namespaces()
        assert cluster.lookup(cluster.pod_name(0), other.ns) == []
        # The DNS server's MAC must not change with the bridge's ports: the survivors' ARP
        # entries would point nowhere and their lookups time out for up to half a minute.
        assert Path(f"/sys/class/net/{cluster.bridge}/address").read_text() == bridge_mac
        new = cluster.create_pod(0)
        assert new.address != pod.address and new.ns != pod.ns
        cluster.run_pod(new, [sys.executable, "-c", script], run_id="sleep")
        _wait_for(lambda: len(namespace_pids(new.ns)) >= 2, 20, "the process tree")
        dnsmasq = cluster.dnsmasq
        leftovers = [new.ns, other.ns]
    assert dnsmasq is not None and dnsmasq.poll() is not None
    assert not set(leftovers) & set(list_namespaces())
    assert not [link for link in _links() if cluster.tag in link]
    assert not (NETNS_ETC / new.ns).exists()


def test_clusters_built_while_another_process_sweeps_leftovers_keep_all_they_built(
    netns_available: None, tmp_path: Path
) -> None:
    """Every test process sweeps what dead runs left when it sets up a cluster, and test processes
    run side by side. A sweep that had read the live owners just before another process registered
    its cluster took that cluster's new bridge and namespaces for leftovers and deleted them
    ("Cannot find device nvtb-...", under load). Registering and sweeping now exclude each other."""
    stop = tmp_path / "stop"
    sweeper = subprocess.Popen(
        [sys.executable, "-c", _SWEEPER, str(MULTINODE), str(stop)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert sweeper.stdout is not None
        assert sweeper.stdout.readline().strip() == "sweeping"
        for i in range(12):
            with Cluster(tmp_path / f"cluster{i}", job="trainer") as cluster:
                pods = [cluster.create_pod(index) for index in range(2)]
                for pod in pods:
                    cluster.publish(pod)
                assert cluster.lookup(cluster.pod_name(0), pods[1].ns) == [pods[0].address]
                links = _links()
                assert cluster.bridge in links
                assert {pod.ns for pod in pods} <= set(list_namespaces())
                assert cluster.dnsmasq is not None and cluster.dnsmasq.poll() is None
    finally:
        stop.touch()
        out, _ = sweeper.communicate(timeout=120)
    assert sweeper.returncode == 0, out
    assert out.startswith("swept"), out

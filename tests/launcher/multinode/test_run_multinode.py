"""``nvtrain run`` as the entrypoint of several pods: pods that die whole and come back under the
same name with a new address, a peer that never resolves. (DNS records that come late: in
``test_renamed_job.py``.)

Each pod is a network namespace with its own address (``netns_pods.py``); pod names resolve
through a real dnsmasq. The job is the CPU demo (``nvtrain.demo``) under NVRx's ft_launcher.
Every test ends within its own budget (below the module's pytest timeout) so that a hang shows up as
a failure with every pod's log, not as a timeout.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from netns_pods import Cluster, Pod, policy_toml

from nvtrain.runlog import pod_files
from support import waiting

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RUN_ID = "mn-run"
BUDGET = 288.0
"""Seconds a test may spend before giving up (the module's pytest timeout is 300 s; teardown
needs some). A liveness bound, not a speed target: on 2 loaded cores, a replaced pod 0 took 49 s
from the kill to the restore (three launchers and six workers starting), and 108 s was too tight
for one replacement; the replacement test has two."""


@pytest.fixture
def deadline() -> float:
    """time.monotonic() by which the test must have its answer."""
    return time.monotonic() + BUDGET


def write_policy(tmp_path: Path, cluster: Cluster, **kwargs: Any) -> tuple[Path, Path]:
    """(policy path, events path) for a demo job on ``cluster``; its workers start cold, as by
    default (one rank per pod: a warm start would cost as much CPU as it saves)."""
    checkpoints = tmp_path / "checkpoints"
    policy = tmp_path / "policy.toml"
    kwargs.setdefault("warm_start", False)
    policy.write_text(policy_toml(job=cluster.job, checkpoint_dir=checkpoints, **kwargs))
    return policy, checkpoints / RUN_ID  # the run directory: every pod's events log


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every pod's events in ``run_dir``, merged in time order; [] when there are none yet."""
    events = []
    for path in pod_files(run_dir):
        for line in path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return sorted(events, key=lambda event: float(event["ts"]))


def events_of(events: list[dict[str, Any]], name: str, node: int | None = None) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == name and (node is None or e.get("node") == node)]


def wait_until(predicate: Callable[[], object], deadline: float, what: str, cluster: Cluster) -> None:
    waiting.wait_until(
        predicate, max(0.0, deadline - time.monotonic()), what, detail=cluster.describe, interval=0.2
    )


def wait_exit(pods: Iterable[Pod], deadline: float) -> dict[int, int | None]:
    """Exit codes of ``pods`` by index, waiting until ``deadline`` (None: still running)."""
    pods = list(pods)
    while time.monotonic() < deadline and any(p.returncode() is None for p in pods):
        time.sleep(0.2)
    return {p.index: p.returncode() for p in pods}


def all_logs(cluster: Cluster) -> str:
    return "\n".join(p.log() for p in cluster.history)


def finished_ranks(text: str) -> set[int]:
    return {int(m) for m in re.findall(r"DEMO rank (\d+) finished", text)}


def last_step(cluster: Cluster) -> int:
    steps = re.findall(r"DEMO step (\d+)/", all_logs(cluster))
    return int(steps[-1]) if steps else 0


# --------------------------------------------------------------------------------------------


def _kill_and_replace(cluster: Cluster, policy: Path, victim: int) -> float:
    """Pod ``victim`` dies whole and comes back under its name with a new address 2 s later (the
    new pod is scheduled; meanwhile its name does not resolve). Returns the kill's time."""
    old = cluster.pods[victim]
    killed_at = time.time()
    cluster.kill_pod(victim)
    time.sleep(2)  # not a synchronisation: the scenario's 2 s before the new pod is scheduled
    new = cluster.replace_pod(victim, policy, run_id=RUN_ID)
    assert new.address != old.address and new.fqdn == old.fqdn
    return killed_at


def _rounds_of_all_three(events: list[dict[str, Any]], since: float, until: float) -> list[dict[str, Any]]:
    """The rendezvous rounds done between ``since`` and ``until``: every node took part, in a
    world of three nodes."""
    rounds = [e for e in events_of(events, "rendezvous_done") if since < e["ts"] < until]
    assert {e["node"] for e in rounds} == {0, 1, 2}, rounds
    assert all(e["nodes"] == 3 for e in rounds), rounds
    return rounds


def test_pod_2_then_pod_0_replaced_mid_run(cluster: Cluster, tmp_path: Path, deadline: float) -> None:
    """Three pods train (one rank each). (b) Pod 2 (not the rendezvous host) dies whole mid-run; a
    new pod 2 with a new address joins under the same name and a later rendezvous round of all
    three nodes. (c) Then pod 0, the rendezvous store's host, dies whole and comes back the same
    way. Losing pod 0 must not end the job either: the survivors re-resolve its name, rejoin the
    new pod 0's store, and the job completes with exit 0 everywhere."""
    steps = 100
    policy, events_path = write_policy(
        tmp_path, cluster, nodes=3, nproc_per_node=1, steps=steps, checkpoint_interval=10
    )
    for i in range(3):
        cluster.start_nvtrain(i, policy, run_id=RUN_ID, publish=True)
    wait_until(lambda: last_step(cluster) >= 20, deadline - 150, "training to reach step 20", cluster)
    pod_2_killed = _kill_and_replace(cluster, policy, victim=2)

    def rejoined() -> bool:
        after = [e for e in events_of(read_events(events_path), "rendezvous_done") if e["ts"] > pod_2_killed]
        return {e["node"] for e in after} == {0, 1, 2} and last_step(cluster) >= 50

    wait_until(rejoined, deadline - 80, "the new pod 2 to rejoin and training to reach step 50", cluster)
    pod_0_killed = _kill_and_replace(cluster, policy, victim=0)
    codes = wait_exit(cluster.pods.values(), deadline)
    assert codes == {0: 0, 1: 0, 2: 0}, f"exit codes {codes}\n{cluster.describe()}"
    assert finished_ranks(all_logs(cluster)) == {0, 1, 2}, cluster.describe()
    events = read_events(events_path)
    # Pod 2 joined a later round of pod 0's store; the new pod 0's store counts from round 0.
    rounds = _rounds_of_all_three(events, pod_2_killed, pod_0_killed)
    assert all(e["round"] >= 1 for e in rounds), rounds
    _rounds_of_all_three(events, pod_0_killed, float("inf"))
    new_pod0 = cluster.pods[0].address
    resolved = [e for e in events_of(events, "dns_resolved") if e["ts"] > pod_0_killed]
    assert {e["node"] for e in resolved if e["addresses"] == [new_pod0]} >= {1, 2}, (
        f"the survivors never re-resolved pod 0's name to its new address {new_pod0}: {resolved}"
    )


def test_peer_never_resolves(cluster: Cluster, tmp_path: Path) -> None:
    """(d) Pod 0's name never appears in DNS: pod 1 gives up after dns_timeout with exit 3 and
    a message that names what it waited for."""
    dns_timeout = 5.0
    policy, _ = write_policy(tmp_path, cluster, nodes=2, nproc_per_node=1, steps=10, dns_timeout="5s")
    started = time.monotonic()
    pod = cluster.start_nvtrain(1, policy, run_id=RUN_ID, publish=True)
    codes = wait_exit([pod], started + dns_timeout + 15)
    elapsed = time.monotonic() - started
    assert codes == {1: 3}, f"exit codes {codes} after {elapsed:.1f}s\n{cluster.describe()}"
    assert dns_timeout <= elapsed <= dns_timeout + 8, f"exit 3 after {elapsed:.1f}s\n{cluster.describe()}"
    assert cluster.pod_name(0) in pod.log(), pod.log()
    assert "ft_launcher" not in pod.log().split("\n", 1)[1], "ft_launcher must not start"

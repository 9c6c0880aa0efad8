"""A job renamed after ``nvtrain manifest`` still finds its peers: 2 pods x 2 ranks whose Job,
Service and namespace are not the policy's, as after a Kustomize ``namePrefix: exp1-`` and
``namespace: team-a``, while the policy in the ConfigMap still says ``[job] name = "trainer"`` and
``namespace = "default"``.

The pods are named as Kubernetes names them then (hostname ``exp1-trainer-<i>``, the kubelet's
``/etc/hosts`` line ``exp1-trainer-<i>.exp1-trainer.team-a.svc.<domain>``), and dnsmasq serves
only the renamed records: the policy's names do not exist, so a pod that dialled them would wait
``[rendezvous] dns_timeout`` and exit 3. dnsmasq logs every query, which shows that none was
asked for.

The pods also start before their DNS records exist, as on Kubernetes, where the records of a
headless Service come some seconds after the pods: they wait for them, then train to the end.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from netns_pods import DOMAIN, Cluster, policy_toml
from test_run_multinode import all_logs, events_of, finished_ranks, read_events, wait_exit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

JOB = "trainer"
"""``[job] name`` of the policy (and the Service name it implies)."""
PREFIX = "exp1-"
NAMESPACE = "team-a"
NODES, NPROC, STEPS = 2, 2, 20
RUN_ID = "mn-renamed"
BUDGET = 228.0
"""Seconds the pods may take (the pytest timeout is 240 s; teardown needs some). A liveness bound
for 2 loaded cores, not a speed target."""


def _queried(log: Path) -> list[str]:
    """The names dnsmasq was asked for (``--log-queries``), in order."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [name.lower().rstrip(".") for name in re.findall(r"query\[\w+\] (\S+) from ", text)]


def test_a_renamed_job_finds_its_peers(netns_available: None, tmp_path: Path) -> None:
    renamed = PREFIX + JOB
    with Cluster(tmp_path / "cluster", job=renamed, service=renamed, namespace=NAMESPACE) as cluster:
        checkpoints = tmp_path / "checkpoints"
        policy = tmp_path / "policy.toml"
        policy.write_text(
            policy_toml(
                job=JOB,
                nodes=NODES,
                nproc_per_node=NPROC,
                steps=STEPS,
                checkpoint_dir=checkpoints,
                # forked from each pod's server: the names are the point here, and cold
                # multi-node starts are test_run_multinode's
                warm_start=True,
            )
        )
        pods = [cluster.start_nvtrain(i, policy, run_id=RUN_ID) for i in range(NODES)]
        assert [p.hostname for p in pods] == [f"{renamed}-{i}" for i in range(NODES)]
        time.sleep(5)  # the records come late (not a synchronisation: the scenario's delay)
        published = time.time()
        for pod in pods:
            cluster.publish(pod)

        codes = wait_exit(pods, time.monotonic() + BUDGET)
        assert codes == {0: 0, 1: 0}, f"exit codes {codes}\n{cluster.describe()}"
        assert finished_ranks(all_logs(cluster)) == set(range(NODES * NPROC)), cluster.describe()

        events = read_events(checkpoints / RUN_ID)
        pod0 = f"{renamed}-0.{renamed}.{NAMESPACE}.svc.{DOMAIN}"
        assert cluster.pod_name(0) == pod0
        resolved = events_of(events, "dns_resolved", 1)
        assert resolved, f"node 1: no dns_resolved event\n{cluster.describe()}"
        # Once, or again after a restart on a loaded machine: always pod 0's renamed name.
        assert {(e["name"], tuple(e["addresses"])) for e in resolved} == {(pod0, (pods[0].address,))}, (
            resolved
        )
        # Pod 0 finds its own name in /etc/hosts (the kubelet writes it there); pod 1 must wait
        # for DNS.
        assert resolved[0]["ts"] >= published - 0.5, "resolved before the record existed"
        for node in range(NODES):
            own = events_of(events, "dns_resolved", node)
            assert own and own[0]["name"] == pod0 and own[0]["addresses"] == [pods[0].address], own
            done = events_of(events, "rendezvous_done", node)
            assert done and done[-1]["nodes"] == NODES, f"node {node}: {done}"
            assert events_of(events, "launcher_exit", node)[-1]["exit_code"] == 0

        # Pod 1 asked DNS for pod 0's renamed name, and nobody asked for one of the policy's
        # (first label "trainer" or "trainer-<i>", or the namespace "default").
        queried = _queried(cluster.dns_log)
        assert pod0 in queried, f"dnsmasq logged no query for {pod0}: {queried}"
        policy_labels = {JOB, *(f"{JOB}-{i}" for i in range(NODES))}
        stray = [n for n in queried if n.split(".")[0] in policy_labels or ".default.svc." in f".{n}."]
        assert not stray, f"lookups of the policy's un-prefixed names: {stray}"

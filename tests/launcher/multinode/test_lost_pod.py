"""A pod lost whole restores from the copies its peers keep: 2 pods x 2 ranks (network namespaces,
real dnsmasq, real ``nvtrain run`` + ft_launcher, gloo, workers forked from each pod's warm-start
server), each pod with its own ``/dev/shm``. Every rank's host copy is also kept by the rank of
the other pod (``[checkpoint] peer_copy``). Pod 1 dies whole (its processes and its memory) and a
new pod 1 joins: its ranks restore from the copies pod 0 kept, pod 0's ranks from their own, and
the run ends bitwise where the same run without the loss ends (the clean 4-rank demo run that the
fault matrices compare with too).

To lose the pod at a known point, rank 0 hangs right after the save of step 20 (the other ranks
then wait in the next step's collective; the heartbeat and collective timeouts are longer than
the test needs): the newest commit is step 20 when pod 1 is killed, once the events say that
step 20 is committed and every rank's copy of it was exchanged.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from netns_pods import Cluster, namespace_pids, policy_toml
from test_run_multinode import events_of, read_events, wait_exit, wait_until

from support.worker_helpers import assert_clean_exit, clean_demo_run

# 480 s: the shared clean run (up to 200 s, when this test is the first to ask for it) and this
# test's own 240 s budget.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

NODES, NPROC, STEPS, SAVED = 2, 2, 60, 20
FINGERPRINT = re.compile(r"DEMO rank (\d+) finished fingerprint ([0-9a-f]{16})")


def _policy(cluster: Cluster, path: Path, checkpoints: Path) -> Path:
    text = policy_toml(
        job=cluster.job,
        nodes=NODES,
        nproc_per_node=NPROC,
        steps=STEPS,
        checkpoint_dir=checkpoints,
        step_time=0.02,
        log_every=1,
        collective_timeout="90s",
        checkpoint_interval=10,
    )
    text = text.replace('timeout = "10s"\nmonitor_interval', 'timeout = "30s"\nmonitor_interval')
    text = text.replace("[job]\n", '[job]\nbackend = "gloo"\n', 1)
    text += "async = true\npeer_copy = true\n"
    text += f'\n[[faults]]\nstep = {SAVED}\nrank = 0\nkind = "hang"\n'
    path.write_text(text)
    return path


def _fingerprints(logs: str) -> dict[int, str]:
    prints: dict[int, str] = {}
    for rank, digest in FINGERPRINT.findall(logs):
        assert prints.setdefault(int(rank), digest) == digest, f"rank {rank} printed two fingerprints"
    return prints


def test_a_lost_pod_restores_from_its_peers_copies_bitwise(
    cluster: Cluster, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    reference = clean_demo_run(tmp_path_factory, ranks=NODES * NPROC, steps=STEPS)
    assert_clean_exit(reference)
    clean = reference.fingerprints()
    assert sorted(clean) == list(range(NODES * NPROC)), reference.describe()

    checkpoints = tmp_path / "checkpoints"
    deadline = time.monotonic() + 240
    policy = _policy(cluster, tmp_path / "lost.toml", checkpoints)
    events_path = checkpoints / "lost"  # the run directory: both pods' events logs
    for i in range(NODES):
        cluster.start_nvtrain(i, policy, run_id="lost", publish=True)

    def saved_and_exchanged() -> bool:
        events = read_events(events_path)
        committed = any(e.get("step") == SAVED for e in events_of(events, "checkpoint_committed"))
        exchanged = {
            e["rank"]
            for e in events_of(events, "checkpoint_replicated")
            if e.get("step") == SAVED and e.get("received_bytes")
        }
        return committed and exchanged == set(range(NODES * NPROC))

    wait_until(saved_and_exchanged, deadline - 150, f"step {SAVED} committed and exchanged", cluster)
    assert events_of(read_events(events_path), "fault_injected"), "rank 0 never hung"
    killed_at = time.time()
    old = cluster.kill_pod(1)
    new = cluster.replace_pod(1, policy, run_id="lost")
    assert new.address != old.address

    codes = wait_exit([cluster.pods[0], new], deadline)
    assert codes == {0: 0, 1: 0}, f"exit codes {codes}\n{cluster.describe()}"
    lost = _fingerprints("\n".join(p.log() for p in cluster.history))  # the killed pod 1 printed none
    assert lost == clean, f"{lost} != {clean}\n{cluster.describe()}"
    assert {i: namespace_pids(cluster.pods[i].ns) for i in range(NODES)} == {0: [], 1: []}

    events = read_events(events_path)
    restored: dict[int, Any] = {}
    for e in events_of(events, "checkpoint_restored"):
        if e["ts"] > killed_at:
            restored.setdefault(e["rank"], e)
    assert {r: (e["step"], e["origin"]) for r, e in restored.items()} == {
        0: (SAVED, "memory"),
        1: (SAVED, "memory"),
        2: (SAVED, "peer"),
        3: (SAVED, "peer"),
    }, restored

"""The fault matrix across pods: 2 pods x 2 ranks (network namespaces, real dnsmasq, real
``nvtrain run`` + ft_launcher + NVRx in-process restart, gloo), one fault of each kind on ranks of both
pods, the workers forked from each pod's warm-start server (``[job] warm_start``; the 2-pod path
with cold workers is ``test_renamed_job.py``'s). The ranks that survive a SIGKILL, on the same pod
and on the other, must be out at once (no stop-timeout wait); the run ends bitwise where the same
run without faults ends (the clean 4-rank demo run that ``test_fault_matrix.py`` compares with
too: the demo's state depends on the world size, not on how the ranks are spread over pods); no
process is left in either pod once its ``nvtrain run`` has exited."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from netns_pods import Cluster, namespace_pids, policy_toml
from test_run_multinode import events_of, read_events, wait_exit

from support.worker_helpers import assert_clean_exit, clean_demo_run

# 480 s: the faulty run (up to 240 s) and the shared clean run (up to 200 s, when this test is
# the first to ask for it).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

NODES, NPROC, STEPS = 2, 2, 60
STOP_TIMEOUT = 10.0
FAULTS = [
    {"step": 12, "rank": 3, "kind": "exception"},  # pod 1
    {"step": 22, "rank": 0, "kind": "hang"},  # pod 0
    {"step": 31, "rank": 1, "kind": "sigkill"},  # pod 0, in a step
    {"step": 41, "rank": 2, "kind": "collective_sigkill"},  # pod 1, a receive posted
    {"step": 50, "rank": 3, "kind": "sigkill"},  # pod 1, while the save of step 50 is written
]
IN_PROCESS = {"exception", "hang"}
FINGERPRINT = re.compile(r"DEMO rank (\d+) finished fingerprint ([0-9a-f]{16})")


def _policy(cluster: Cluster, path: Path, checkpoints: Path, faults: list[dict[str, Any]]) -> Path:
    text = policy_toml(
        job=cluster.job,
        nodes=NODES,
        nproc_per_node=NPROC,
        steps=STEPS,
        checkpoint_dir=checkpoints,
        step_time=0.0,
        log_every=1,
        stop_timeout=f"{STOP_TIMEOUT:g}s",
        collective_timeout="4s",
        checkpoint_interval=5,
        max_restarts=6,
        escalate_after=6,
    )
    text = text.replace(
        "[restart.in_process]\nenabled = false\n",
        '[restart.in_process]\nenabled = true\nmax_attempts = 5\nsoft_timeout = "5s"\nhard_timeout = "10s"\n',
    )
    text = text.replace('timeout = "10s"\nmonitor_interval', 'timeout = "12s"\nmonitor_interval')
    text = text.replace("[job]\n", '[job]\nbackend = "gloo"\n', 1)
    text += "async = true\n" + "".join(
        f'\n[[faults]]\nstep = {f["step"]}\nrank = {f["rank"]}\nkind = "{f["kind"]}"\n' for f in faults
    )
    path.write_text(text)
    return path


def _run(cluster: Cluster, policy: Path, run_id: str, budget: float) -> dict[str, Any]:
    pods = [cluster.start_nvtrain(i, policy, run_id=run_id, publish=True) for i in range(NODES)]
    codes = wait_exit(pods, time.monotonic() + budget)
    left = {p.index: namespace_pids(p.ns) for p in pods}
    logs = "\n".join(p.log() for p in pods)
    prints: dict[int, str] = {}
    for rank, digest in FINGERPRINT.findall(logs):
        assert prints.setdefault(int(rank), digest) == digest, f"rank {rank} printed two fingerprints"
    for pod in pods:  # the next run gets fresh pods under the same names
        cluster.kill_pod(pod.index)
    return {"codes": codes, "left": left, "fingerprints": prints, "logs": logs}


def test_faults_on_both_pods_recover_to_the_clean_runs_state(
    cluster: Cluster, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    checkpoints = tmp_path / "checkpoints"
    faulty = _run(cluster, _policy(cluster, tmp_path / "faulty.toml", checkpoints, FAULTS), "faulty", 240)
    clean = clean_demo_run(tmp_path_factory, ranks=NODES * NPROC, steps=STEPS)
    assert_clean_exit(clean)
    assert sorted(clean.fingerprints()) == list(range(NODES * NPROC)), clean.describe()
    context = f"\n{cluster.describe()}"
    assert faulty["codes"] == {0: 0, 1: 0}, f"faulty run: {faulty['codes']}{context}"
    assert faulty["left"] == {0: [], 1: []}, faulty["left"]
    assert faulty["fingerprints"] == clean.fingerprints(), faulty["logs"][-6000:]

    events = read_events(checkpoints / "faulty")
    assert "Unable to shutdown process" not in faulty["logs"], faulty["logs"][-6000:]
    # The workers start warm (each pod's warm-start server); the ones that replace a killed
    # group are always forked, the server having long finished its imports by then.
    assert "warm start: off" not in faulty["logs"], faulty["logs"][-6000:]
    starts = events_of(events, "worker_start")
    replacements = [e for e in starts if e.get("restart_count", 0) > 0]
    assert replacements and all(e.get("warm") is True for e in replacements), replacements
    stopped = events_of(events, "worker_stopped")
    assert [e for e in stopped if e.get("waited_s", 0.0) > 1.0 + STOP_TIMEOUT / 2] == [], stopped

    fired = events_of(events, "fault_injected")
    assert sorted((e["step"], e["rank"], e["kind"]) for e in fired) == sorted(
        (f["step"], f["rank"], f["kind"]) for f in FAULTS
    )
    times = sorted(e["ts"] for e in fired)
    for fault in FAULTS:
        at = next(e["ts"] for e in fired if e["step"] == fault["step"])
        until = min([t for t in times if t > at], default=float("inf"))
        window = [e for e in events if at <= e["ts"] < until]
        layers = {e.get("layer") for e in window if e["event"] == "restart_begin"}
        expected = "in_process" if fault["kind"] in IN_PROCESS else "in_job"
        assert expected in layers, (fault, sorted(str(x) for x in layers))
        restored = [e for e in window if e["event"] == "checkpoint_restored"]
        assert sorted({e["rank"] for e in restored}) == list(range(NODES * NPROC)), (fault, restored)
        if expected == "in_job":
            # Every pod's launcher restarted its workers: the survivors were stopped, promptly.
            failed = [e for e in window if e["event"] == "worker_failed"]
            rounds = [e for e in window if e["event"] == "rendezvous_done"]
            assert failed and {e["node"] for e in rounds} == {0, 1}, (fault, failed, rounds)
            # "Promptly" is the worker_stopped bound and the absence of ft_launcher's "Unable
            # to shutdown" above (events), not the wall time to the new rendezvous: that
            # measures the machine's load (BENCHMARKS.md has the recovery times).

"""The fault matrix on one node: 4 ranks (gloo, FSDP2 demo, real ``nvtrain run`` + ft_launcher +
NVRx in-process restart) through one fault of every kind that matters for the survivors:

- SIGKILL of one rank in a step, with a receive posted (in a collective), and while its
  checkpoint write is in flight: ft_launcher restarts the workers; the three survivors must be
  out at once (no stop-timeout wait), whatever they were doing;
- an exception and a hang (in Python): the in-process layer restarts all four ranks.

The faulty run has ``[job] warm_start = true``: the workers that replace a killed group are
forked from the warm-start server, and ft_launcher knows each by the pid it started (the
client). The clean run starts cold (``warm_start = false``): after the run the warm, faulty state is
bitwise the cold, clean one (every restore, after a SIGKILL too, read the host copy in
/dev/shm), nothing the run started (nor the server, nor the host copies) is left, and no
recovery phase in ``nvtrain report`` waited out a stop timeout. The 2-rank variant of the same
checks, cold, lives in ``test_recovery.py``; 2 pods x 2 ranks, cold, in
``tests/launcher/multinode/test_fault_matrix_pods.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from support.worker_helpers import (
    RunResult,
    assert_clean_exit,
    assert_no_stop_timeout_waited,
    clean_demo_run,
    demo_tables,
    run_nvtrain,
    write_policy,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

RANKS = 4
STEPS = 60
STOP_TIMEOUT = 10.0  # the policy's stop_timeout (demo_tables)
"""ft_launcher's ``--workers-stop-timeout`` (min(stop_timeout, 15 s)): a survivor that ignored
SIGTERM would cost this much in the teardown of an in-job restart."""

FAULTS = [
    {"step": 12, "rank": 1, "kind": "exception"},
    {"step": 22, "rank": 2, "kind": "hang"},
    {"step": 31, "rank": 3, "kind": "sigkill"},  # in a step
    {"step": 41, "rank": 0, "kind": "collective_sigkill"},  # with a receive posted
    {"step": 50, "rank": 1, "kind": "sigkill"},  # while the save of step 50 is written
]
IN_PROCESS = {"exception", "hang"}
RUN_TIMEOUT = 200.0


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    root = tmp_path_factory.mktemp("matrix")
    checkpoints = root / "ckpt"
    policy = demo_tables(checkpoints, name="fault-matrix", ranks=RANKS, steps=STEPS)
    policy["job"]["warm_start"] = True
    faulty_policy = write_policy(root / "faulty.toml", policy, FAULTS)
    # The clean run (cold) is shared with the 2-pod matrix and the lost pod (same world, steps).
    clean = clean_demo_run(tmp_path_factory, ranks=RANKS, steps=STEPS)
    faulty = run_nvtrain(faulty_policy, "faulty", checkpoints, root, RUN_TIMEOUT)
    print(f"clean run {clean.seconds:.0f}s, faulty run {faulty.seconds:.0f}s")
    return {"clean": clean, "faulty": faulty}


def test_every_fault_recovered_to_the_clean_runs_state(runs: dict[str, RunResult]) -> None:
    clean, faulty = runs["clean"], runs["faulty"]
    assert_clean_exit(clean)
    assert_clean_exit(faulty)
    assert sorted(clean.fingerprints()) == list(range(RANKS)), clean.describe()
    assert faulty.fingerprints() == clean.fingerprints(), faulty.describe()
    assert "warm start: off" not in faulty.output


def test_the_clean_run_logs_its_life_and_no_failure(runs: dict[str, RunResult]) -> None:
    """The fault-free run's events log: the launcher's start first, a rendezvous, its exit 0
    last; no worker failed, nothing restarted, and every launcher event names the run."""
    clean = runs["clean"]
    events = clean.events
    names = [e["event"] for e in events]
    assert names[0] == "launcher_start" and names[-1] == "launcher_exit", names
    assert "rendezvous_done" in names, names
    assert events[-1]["exit_code"] == 0
    assert not {"worker_failed", "restart_begin", "fault_injected"} & set(names), names
    launcher = [e for e in events if e.get("source") == "launcher"]
    assert {e["run_id"] for e in launcher} == {"clean"}
    assert "--rdzv-id=clean" in events[0]["argv"]


def _after(events: list[dict[str, Any]], name: str, ts: float) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name and e["ts"] > ts]


def test_replacement_workers_are_forked_warm_and_known_by_their_clients_pid(
    runs: dict[str, RunResult],
) -> None:
    events = runs["faulty"].events
    started = {e["pid"] for e in events if e["event"] == "worker_start"}
    hard = [e for e in events if e["event"] == "fault_injected" and e["kind"] not in IN_PROCESS]
    assert len(hard) == len([f for f in FAULTS if f["kind"] not in IN_PROCESS]), hard
    for fault in hard:
        # Under load a survivor's failure may be logged before the killed worker's: find the
        # killed pid among the failures that follow the fault, in whatever order they came.
        failed = [e for e in _after(events, "worker_failed", fault["ts"]) if e["worker_pid"] == fault["pid"]]
        assert failed, (fault, _after(events, "worker_failed", fault["ts"])[:RANKS])
        assert fault["pid"] in started  # the pid ft_launcher reported is the one the worker logged
        replacements = _after(events, "worker_start", failed[0]["ts"])[:RANKS]
        assert len(replacements) == RANKS and all(e.get("warm") is True for e in replacements), replacements


def test_each_fault_fired_once_and_was_recovered_by_its_layer(runs: dict[str, RunResult]) -> None:
    faulty = runs["faulty"]
    events = faulty.events
    fired = [e for e in events if e["event"] == "fault_injected"]
    assert sorted((e["step"], e["rank"], e["kind"]) for e in fired) == sorted(
        (f["step"], f["rank"], f["kind"]) for f in FAULTS
    )
    by_step = {e["step"]: e for e in fired}
    times = sorted(e["ts"] for e in fired)
    for fault in FAULTS:
        at = by_step[fault["step"]]["ts"]
        until = min([t for t in times if t > at], default=float("inf"))
        window = [e for e in events if at <= e["ts"] < until]
        layers = {e.get("layer") for e in window if e["event"] == "restart_begin"}
        expected = "in_process" if fault["kind"] in IN_PROCESS else "in_job"
        assert expected in layers, (fault, sorted(str(x) for x in layers))
        if expected == "in_process":  # no worker died for a soft fault
            assert [e for e in window if e["event"] == "worker_failed"] == [], fault
        restored = [e for e in window if e["event"] == "checkpoint_restored"]
        assert sorted({e["rank"] for e in restored}) == list(range(RANKS)), (fault, restored)
        assert all(e["step"] <= fault["step"] for e in restored), (fault, restored)
        # Soft and hard faults alike restore from host memory: the staged copy of the newest
        # committed checkpoint outlives a killed worker in the pod's /dev/shm.
        assert {e["origin"] for e in restored} == {"memory"}, (fault, restored)


def test_no_survivor_waits_out_a_stop_timeout(runs: dict[str, RunResult]) -> None:
    assert_no_stop_timeout_waited(runs["faulty"], STOP_TIMEOUT)


def test_the_save_in_flight_at_the_kill_is_never_restored_partial(runs: dict[str, RunResult]) -> None:
    """The rank killed during the write of step 50 leaves that save uncommitted: the restart
    resumes from step 45 (or from 50 if every shard was written before the kill), never from a
    partial folder."""
    faulty = runs["faulty"]
    kill = next(e for e in faulty.events if e["event"] == "fault_injected" and e["step"] == 50)
    restored = [e for e in faulty.events if e["event"] == "checkpoint_restored" and e["ts"] > kill["ts"]]
    assert restored and {e["step"] for e in restored} <= {45, 50}, restored
    assert len({e["step"] for e in restored[:RANKS]}) == 1, restored

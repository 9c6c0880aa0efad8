"""The fault matrix on one node: 4 ranks (gloo, FSDP2 demo, real ``nvtrain run`` + ft_launcher +
NVRx in-process restart) through one fault of every kind that matters for the survivors:

- SIGKILL of one rank in a step, with a receive posted (in a collective), and while its
  checkpoint write is in flight: ft_launcher restarts the workers; the three survivors must be
  out at once (no stop-timeout wait), whatever they were doing;
- an exception and a hang (in Python): the in-process layer restarts all four ranks.

After the run: the state is bitwise the one of the same run without faults (every restore,
after a SIGKILL too, read the host copy in /dev/shm), nothing the run started (nor its host
copies) is left, and no recovery phase in ``nvtrain report`` waited out a stop timeout. The
2-rank variant of the same checks lives in ``test_recovery.py``; 2 pods x 2 ranks in
``tests/multinode/test_fault_matrix_pods.py``.
"""

from __future__ import annotations

import pytest
from worker_helpers import (
    RunResult,
    assert_clean_exit,
    assert_no_stop_timeout_waited,
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
    clean_policy = write_policy(root / "clean.toml", policy)
    faulty_policy = write_policy(root / "faulty.toml", policy, FAULTS)
    clean = run_nvtrain(clean_policy, "clean", checkpoints, root, RUN_TIMEOUT)
    faulty = run_nvtrain(faulty_policy, "faulty", checkpoints, root, RUN_TIMEOUT)
    print(f"clean run {clean.seconds:.0f}s, faulty run {faulty.seconds:.0f}s")
    return {"clean": clean, "faulty": faulty}


def test_every_fault_recovered_to_the_clean_runs_state(runs: dict[str, RunResult]) -> None:
    clean, faulty = runs["clean"], runs["faulty"]
    assert_clean_exit(clean)
    assert_clean_exit(faulty)
    assert sorted(clean.fingerprints()) == list(range(RANKS)), clean.describe()
    assert faulty.fingerprints() == clean.fingerprints(), faulty.describe()


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

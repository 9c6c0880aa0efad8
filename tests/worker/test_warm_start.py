"""``[job] warm_start = true`` under a real ``nvtrain run`` + ft_launcher: 2 ranks (gloo, FSDP2
demo), a SIGKILL in a step and one with a receive posted. The workers that replace the killed
group are forked from the warm-start server (``worker_start.warm``), ft_launcher sees each
worker's death by the pid it started (the client), the restore reads the host copy, and the
state at the end is bitwise the one of the same run, cold and without faults; nothing is left
(processes, the server, host copies)."""

from __future__ import annotations

from typing import Any

import pytest
from worker_helpers import RunResult, assert_clean_exit, demo_tables, run_nvtrain, write_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

RANKS = 2
STEPS = 40
FAULTS = [
    {"step": 13, "rank": 1, "kind": "sigkill"},
    {"step": 27, "rank": 0, "kind": "collective_sigkill"},
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    root = tmp_path_factory.mktemp("warm")
    checkpoints = root / "ckpt"
    tables = demo_tables(checkpoints, name="warm", ranks=RANKS, steps=STEPS)
    tables["restart.in_process"] = {"enabled": False}
    clean = run_nvtrain(write_policy(root / "clean.toml", tables), "cold-clean", checkpoints, root, 200)
    tables["job"]["warm_start"] = True
    warm = run_nvtrain(
        write_policy(root / "warm.toml", tables, FAULTS), "warm-faulty", checkpoints, root, 200
    )
    return {"clean": clean, "warm": warm}


def _after(events: list[dict[str, Any]], name: str, ts: float) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name and e["ts"] > ts]


def test_the_warm_run_recovers_to_the_cold_clean_runs_state(runs: dict[str, RunResult]) -> None:
    clean, warm = runs["clean"], runs["warm"]
    assert_clean_exit(clean)
    assert_clean_exit(warm)  # the server and its workers included
    assert sorted(clean.fingerprints()) == list(range(RANKS)), clean.describe()
    assert warm.fingerprints() == clean.fingerprints(), warm.describe()
    assert "warm start: off" not in warm.output


def test_replacement_workers_are_forked_warm_and_known_by_their_clients_pid(
    runs: dict[str, RunResult],
) -> None:
    events = runs["warm"].events
    fired = [e for e in events if e["event"] == "fault_injected"]
    assert len(fired) == len(FAULTS), fired
    started = {e["pid"] for e in events if e["event"] == "worker_start"}
    for fault in fired:
        # Under load a survivor's failure may be logged before the killed worker's: find the
        # killed pid among the failures that follow the fault, in whatever order they came.
        failed = [e for e in _after(events, "worker_failed", fault["ts"]) if e["worker_pid"] == fault["pid"]]
        assert failed, (fault, _after(events, "worker_failed", fault["ts"])[:RANKS])
        assert fault["pid"] in started  # the pid ft_launcher reported is the one the worker logged
        replacements = _after(events, "worker_start", failed[0]["ts"])[:RANKS]
        assert len(replacements) == RANKS and all(e.get("warm") is True for e in replacements), replacements
        restored = _after(events, "checkpoint_restored", failed[0]["ts"])[:RANKS]
        assert {e["origin"] for e in restored} == {"memory"}, restored

"""In-process restart on gloo with 2 and 4 ranks does not wait out ``collective_timeout``.

A real ``nvtrain run`` of the demo (ft_launcher, NVRx in-process restart, gloo, FSDP2) with an
exception on the last rank. The survivors are blocked in a gloo collective with that rank when
it raises; nvtrain cuts the attempt's gloo connections (``nvtrain.worker.gloo_cut``), so their
collectives fail with a closed connection instead of timing out. The collective timeout here is
45 s (the soft timeout is 60 s, as the gloo rule wants), so a survivor that waited it out would
report "Timed out" as the cause of its restart; none may. With 4 ranks the run must also end
bitwise where the fault-free run ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.worker_helpers import (
    RunResult,
    assert_clean_exit,
    clean_demo_run,
    demo_tables,
    run_nvtrain,
    write_policy,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 60  # as the fault matrix: the 4-rank fault-free run is shared with it


def _run(root: Path, ranks: int) -> RunResult:
    checkpoints = root / "ckpt"
    tables = demo_tables(checkpoints, name=f"gloo-cut-{ranks}", ranks=ranks, steps=STEPS)
    tables["job"]["collective_timeout"] = "45s"
    tables["job"]["warm_start"] = True
    tables["heartbeat"].update({"timeout": "120s", "initial_timeout": "150s"})
    # NVRx aborts the attempt (and nvtrain cuts the links) once the failure window is over: half
    # a second lets the survivors reach their next collective with the failed rank first, so the
    # cut is what frees them. With the 10 ms default they may still be in Python then, and NVRx
    # interrupts them there (as fast, but not what this test is about).
    tables["restart.in_process"].update(
        {"soft_timeout": "60s", "hard_timeout": "90s", "failure_window": "500ms"}
    )
    faults = [{"step": 12, "rank": ranks - 1, "kind": "exception"}]
    policy = write_policy(root / "policy.toml", tables, faults)
    return run_nvtrain(policy, f"gloo-cut-{ranks}", checkpoints, root, 240)


def _restarts(run: RunResult) -> list[dict[str, Any]]:
    """The restarts once training had begun (the first ``attempt_start``). Before it, a worker
    that failed to start is restarted by ft_launcher (rank 0 could not listen on the in-process
    store's port, MASTER_PORT + 1, taken by another socket on a busy host: seen once in CI, a
    known defect, not what this test is about)."""
    began = min(e["ts"] for e in run.events if e["event"] == "attempt_start")
    return [e for e in run.events if e["event"] == "restart_begin" and e["ts"] > began]


@pytest.mark.parametrize("ranks", [2, 4])
def test_survivors_are_freed_from_gloo_at_once(
    ranks: int, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run = _run(tmp_path, ranks)
    assert_clean_exit(run)
    restarts = _restarts(run)
    assert {e.get("layer") for e in restarts} == {"in_process"}, restarts
    assert sorted(e["rank"] for e in restarts) == list(range(ranks)), restarts
    details = {e["rank"]: f"{e.get('cause')}: {e.get('detail')}" for e in restarts}
    assert not [d for d in details.values() if "Timed out" in d], details
    assert "injected exception" in details[ranks - 1], details
    # At least one survivor was inside a collective with the failed rank when it raised, and
    # was let out by gloo's error on the closed connection (any others were interrupted by NVRx
    # in Python). Before the cut, the survivor of the 2-rank run waited out the 45 s.
    assert any("gloo" in details[r] for r in range(ranks - 1)), details
    if ranks == 4:
        clean = clean_demo_run(tmp_path_factory, ranks=ranks, steps=STEPS)
        assert_clean_exit(clean)
        assert run.fingerprints() == clean.fingerprints(), run.describe()

"""The proof that recovery is correct: a 2-rank FSDP2 demo run through seven injected faults of
different kinds ends bitwise where the same run without faults ends, with the same loss at
every step, and the events log shows which layer recovered each fault; ``tune-interval
--from-run`` reads the faulty run's timings.

Both runs are real ``nvtrain run`` jobs (ft_launcher, 2 gloo ranks, NVRx in-process restart),
started once for the module; each test below checks one property of the pair. The clean run
starts cold (``warm_start = false``); the faulty run's workers are forked from the pod's warm-start server
(``[job] warm_start = true``), so that its four in-job restarts do not import torch eight times
over (the cold path's in-job restarts are proven by tests/launcher/test_run_faults.py and the
multi-node runs).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nvtrain.cli import app
from support.worker_helpers import (
    RunResult,
    assert_clean_exit,
    assert_no_stop_timeout_waited,
    demo_tables,
    run_nvtrain,
    write_policy,
)

# One fixture runs both jobs (about 2 minutes on an idle 2-core machine); the test that sets
# it up pays for it, hence the longer timeout.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

STEPS = 72
FAULTS = [
    # in-process restart, just after the save of step 15 started: that save is settled and kept
    {"step": 15, "rank": 1, "kind": "exception"},
    {"step": 24, "rank": 0, "kind": "hang"},  # soft timeout -> in-process restart
    {"step": 36, "rank": 1, "kind": "sigkill"},  # ft_launcher restarts the workers
    {"step": 48, "rank": 0, "kind": "oom"},  # exit 137 -> ft_launcher restarts the workers
    # blocked in a gloo receive: both ranks' collectives time out -> in-process restart
    {"step": 57, "rank": 1, "kind": "collective_hang"},
    # dies with a receive posted: the peer meets a dead rank inside a collective -> ft_launcher
    {"step": 62, "rank": 1, "kind": "collective_sigkill"},
    # the worker's SIGTERM handler settles the save of step 65, exits 143 -> ft_launcher
    {"step": 66, "rank": 0, "kind": "sigterm"},
]
RUN_TIMEOUT = 190.0


def _tables(checkpoint_dir: Path) -> dict[str, dict[str, Any]]:
    """The demo's fault-matrix policy (``demo_tables``), with a shorter stop timeout (the
    SIGTERM fault's settle) and first-heartbeat timeout."""
    tables = demo_tables(checkpoint_dir, name="worker-recovery", ranks=2, steps=STEPS)
    tables["job"]["stop_timeout"] = "5s"
    tables["heartbeat"]["initial_timeout"] = "60s"
    return tables


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    root = tmp_path_factory.mktemp("recovery")
    checkpoints = root / "ckpt"
    clean_policy = write_policy(root / "clean.toml", _tables(checkpoints))
    faulty_tables = _tables(checkpoints)
    faulty_tables["job"]["warm_start"] = True
    faulty_policy = write_policy(root / "faulty.toml", faulty_tables, FAULTS)
    # One after the other: on 2 cores, two jobs at once would trip the short timeouts.
    clean = run_nvtrain(clean_policy, "clean", checkpoints, root, RUN_TIMEOUT)
    faulty = run_nvtrain(faulty_policy, "faulty", checkpoints, root, RUN_TIMEOUT)
    print(f"clean run {clean.seconds:.0f}s, faulty run {faulty.seconds:.0f}s")
    return {"clean": clean, "faulty": faulty}


def _ok(run: RunResult) -> RunResult:
    assert run.code == 0, run.describe()
    exits = [e for e in run.events if e["event"] == "launcher_exit"]
    assert [e["exit_code"] for e in exits] == [0], run.describe()
    return run


def _faults_fired(run: RunResult) -> list[dict[str, Any]]:
    return [e for e in run.events if e["event"] == "fault_injected"]


def _fault_event(run: RunResult, kind: str) -> dict[str, Any]:
    fired = [e for e in _faults_fired(run) if e["kind"] == kind]
    assert len(fired) == 1, f"{kind}: {fired}"
    return fired[0]


def test_recovered_run_ends_with_the_fingerprints_of_the_clean_run(runs: dict[str, RunResult]) -> None:
    clean, faulty = _ok(runs["clean"]), _ok(runs["faulty"])
    assert sorted(clean.fingerprints()) == [0, 1], clean.describe()
    assert faulty.fingerprints() == clean.fingerprints(), faulty.describe()


def test_the_faulty_runs_workers_were_forked_warm_and_the_clean_runs_cold(
    runs: dict[str, RunResult],
) -> None:
    clean, faulty = _ok(runs["clean"]), _ok(runs["faulty"])
    assert "warm start: off" not in faulty.output, faulty.describe()
    starts = [e for e in faulty.events if e["event"] == "worker_start"]
    assert len(starts) >= 2 * 5 and all(e.get("warm") is True for e in starts), starts
    assert all(not e.get("warm") for e in clean.events if e["event"] == "worker_start")


def test_recovered_loss_curve_matches_the_clean_run_step_for_step(runs: dict[str, RunResult]) -> None:
    clean, faulty = _ok(runs["clean"]), _ok(runs["faulty"])
    reference = clean.losses()
    assert sorted(reference) == list(range(1, STEPS + 1)), clean.describe()
    assert all(len(v) == 1 for v in reference.values()), "the clean run replayed a step"
    printed = faulty.losses()
    assert sorted(printed) == list(range(1, STEPS + 1)), faulty.describe()
    mismatches = {
        step: (losses, reference[step])
        for step, losses in printed.items()
        if any(loss != reference[step][0] for loss in losses)
    }
    assert mismatches == {}, f"(faulty run's losses, clean loss) per step: {mismatches}"
    # Every fault sends the run back to a checkpoint before it, so its step is printed again;
    # except the exception at step 15, whose save (of step 15) was settled: nothing replayed.
    replayed = {step for step, losses in printed.items() if len(losses) > 1}
    assert {f["step"] for f in FAULTS if f["step"] != 15} <= replayed, sorted(replayed)
    assert not replayed & set(range(11, 16)), sorted(replayed)


def test_each_fault_fired_exactly_once(runs: dict[str, RunResult]) -> None:
    faulty = _ok(runs["faulty"])
    fired = Counter((e["step"], e["rank"], e["kind"]) for e in _faults_fired(faulty))
    assert fired == Counter((f["step"], f["rank"], f["kind"]) for f in FAULTS)
    markers = sorted(p.name for p in (faulty.run_dir / "faults").iterdir())
    assert markers == [f"{i}.fired" for i in range(len(FAULTS))]
    assert _faults_fired(runs["clean"]) == []


@pytest.mark.parametrize("kind", ["exception", "hang"])
def test_soft_fault_is_recovered_in_process(runs: dict[str, RunResult], kind: str) -> None:
    """The faulty process survives: it restarts its training function in place (restart_end,
    layer in_process, same pid) and is never reported as a failed worker."""
    faulty = _ok(runs["faulty"])
    fault = _fault_event(faulty, kind)
    events = faulty.events
    restarted = [
        e
        for e in events
        if e["event"] == "restart_end"
        and e.get("layer") == "in_process"
        and e["pid"] == fault["pid"]
        and e["ts"] > fault["ts"]
    ]
    # Only until the next injected fault: a later SIGKILL of the peer makes ft_launcher stop
    # this (healthy) worker too, and it may then be reported as failed.
    later = [e["ts"] for e in _faults_fired(faulty) if e["ts"] > fault["ts"]]
    until = min(later, default=float("inf"))
    failed = [
        e
        for e in events
        if e["event"] == "worker_failed" and e["worker_pid"] == fault["pid"] and e["ts"] < until
    ]
    summary = [
        (e["event"], e.get("rank"), e.get("layer"), e.get("worker_pid"), e.get("exit_code"))
        for e in events
        if e["event"] in ("fault_injected", "restart_begin", "restart_end", "worker_failed")
    ]
    assert failed == [], f"the {kind} fault killed its worker: {summary}"
    assert restarted, f"no in-process restart of pid {fault['pid']} after the {kind} fault: {summary}"
    resumed = [
        e
        for e in events
        if e["event"] == "checkpoint_restored" and e["pid"] == fault["pid"] and e["ts"] > fault["ts"]
    ]
    assert resumed, f"no restore after the {kind} fault"
    assert all(e["bytes"] > 0 for e in resumed), resumed  # the restored state's size is logged
    # The restart names its cause: the failing rank's own fault
    begun = [
        e
        for e in events
        if e["event"] == "restart_begin" and e.get("layer") == "in_process" and e["ts"] > fault["ts"]
    ][:2]
    causes = {e["rank"]: e.get("cause") for e in begun}
    # The hung rank: its own soft timeout, or (gloo) the peer's collective with it timed out
    # first (collective_timeout < soft_timeout, as validate requires with gloo).
    own = ("exception (InjectedFault)",) if kind == "exception" else ("soft timeout", "peer exception")
    assert causes.get(fault["rank"]) in own, begun
    # The peer restarts because of it: told by NVRx ("peer ..."), or its gloo collective with
    # the failing rank failed first (its own exception). After a hang the peer is blocked in a
    # collective with the hung rank, so its own progress stops too and its soft timeout may fire
    # first (seen in CI): that is a correct cause as well.
    peer_causes: tuple[str, ...] = ("peer ", "exception (RuntimeError)")
    if kind == "hang":
        peer_causes += ("soft timeout",)
    assert str(causes.get(1 - fault["rank"])).startswith(peer_causes), begun
    if kind == "exception":
        # The fault fired right after the save of its step started: every rank let that save
        # finish before the abort, so the restart resumed from it rather than from step 10.
        settled = [e for e in events if e["event"] == "checkpoint_settled" and e["step"] == fault["step"]]
        assert sorted(e["rank"] for e in settled) == [0, 1] and all(e["finished"] for e in settled), settled
        assert resumed[0]["step"] == fault["step"], resumed
    else:
        assert resumed[0]["step"] < fault["step"], resumed
        # Step 24 is not a sampled step (every 10th, saves, the first of an attempt), yet the
        # report must know it was reached: both ranks log it on their way out of the attempt.
        # (Stamped with the time the step completed: the peer's may come a moment after the fault.)
        # (Steps of the next fault are its own: with gloo's 4 s collective timeout the run can
        # reach it within 5 s.)
        next_step = min(f["step"] for f in FAULTS if f["step"] > fault["step"])
        last = [
            e
            for e in events
            if e["event"] == "step"
            and e.get("unsampled")
            and abs(e["ts"] - fault["ts"]) < 5
            and e["step"] < next_step
        ]
        assert sorted((e["rank"], e["step"]) for e in last) == [(0, 24), (1, 24)], last


@pytest.mark.parametrize(
    ("kind", "signal", "exit_code"),
    [
        ("sigkill", "SIGKILL", -9),
        ("collective_sigkill", "SIGKILL", -9),
        ("oom", None, 137),
        ("sigterm", None, 143),
    ],
)
def test_hard_fault_is_recovered_by_an_in_job_restart(
    runs: dict[str, RunResult], kind: str, signal: str | None, exit_code: int
) -> None:
    faulty = _ok(runs["faulty"])
    fault = _fault_event(faulty, kind)
    events = faulty.events
    # Only until the next injected fault: a later SIGKILL of the peer makes ft_launcher stop
    # this (healthy) worker too, and it may then be reported as failed.
    later = [e["ts"] for e in _faults_fired(faulty) if e["ts"] > fault["ts"]]
    until = min(later, default=float("inf"))
    # A SIGTERM asks a worker to stop: it logs worker_stopped, and its end is a worker_ended
    # (issue 39), not a worker_failed; the other hard faults are failures.
    ends = "worker_ended" if kind == "sigterm" else "worker_failed"
    failed = [e for e in events if e["event"] == ends and e["worker_pid"] == fault["pid"] and e["ts"] < until]
    if kind == "sigterm":
        assert not [e for e in events if e["event"] == "worker_failed" and e["worker_pid"] == fault["pid"]]
    if kind == "sigterm" and not failed:
        # A worker stopping on SIGTERM leaves through NVRx's wrapper, which holds it at its
        # iteration barrier until the peer joins; the peer, blocked in a gloo collective until
        # collective_timeout, then restarts in process without it and may exit before it does
        # (seen in CI), so ft_launcher reports the peer. The stop itself must still come first.
        stopped = [e for e in events if e["event"] == "worker_stopped" and e["pid"] == fault["pid"]]
        failed = [e for e in events if e["event"] == "worker_failed" and fault["ts"] < e["ts"] < until]
        assert stopped and failed and stopped[0]["ts"] <= failed[0]["ts"], (stopped, failed)
        assert failed[0]["local_rank"] == 1 - fault["rank"], failed
    else:
        assert len(failed) == 1, failed
        assert (failed[0]["exit_code"], failed[0]["signal"], failed[0]["local_rank"]) == (
            exit_code,
            signal,
            fault["rank"],
        )
    restarts = [
        e
        for e in events
        if e["event"] == "restart_begin" and e.get("layer") == "in_job" and e["ts"] >= failed[0]["ts"]
    ]
    assert restarts, "no in-job restart after the worker failed"
    # The replacement worker of that rank restores a checkpoint from before the fault.
    later = [
        e
        for e in events
        if e["event"] == "checkpoint_restored" and e["rank"] == fault["rank"] and e["ts"] > failed[0]["ts"]
    ]
    assert later and later[0]["pid"] != fault["pid"] and later[0]["step"] < fault["step"], later


def test_collective_hang_is_recovered_in_process_by_both_ranks(runs: dict[str, RunResult]) -> None:
    """A rank blocked in a receive no peer matches: gloo cannot abort it, so both ranks'
    collectives time out (``collective_timeout``) and both restart in process; no process dies."""
    faulty = _ok(runs["faulty"])
    fault = _fault_event(faulty, "collective_hang")
    later = [e["ts"] for e in _faults_fired(faulty) if e["ts"] > fault["ts"]]
    until = min(later, default=float("inf"))
    window = [e for e in faulty.events if fault["ts"] < e["ts"] < until]
    restarted = sorted(
        e["rank"] for e in window if e["event"] == "restart_end" and e.get("layer") == "in_process"
    )
    assert restarted == [0, 1], [(e["event"], e.get("rank"), e.get("layer")) for e in window]
    assert [e for e in window if e["event"] == "worker_failed"] == []


def test_sigterm_settles_the_save_in_flight_before_the_worker_exits(runs: dict[str, RunResult]) -> None:
    """ft_launcher's stop of the healthy worker is not the pod's stop: the worker logs
    worker_stopped after waiting (at most the soft-fault limit) for its save in flight."""
    faulty = _ok(runs["faulty"])
    fault = _fault_event(faulty, "sigterm")
    stopped = [e for e in faulty.events if e["event"] == "worker_stopped" and e["pid"] == fault["pid"]]
    assert [(e["rank"], e["signal"]) for e in stopped] == [(fault["rank"], "SIGTERM")], stopped


def test_no_survivor_waits_out_a_stop_timeout_and_nothing_is_left(runs: dict[str, RunResult]) -> None:
    """Every hard fault above left a healthy peer that ft_launcher stopped: it was out at once,
    not after the stop timeout; and nothing of either run outlived ``nvtrain run``."""
    assert_clean_exit(runs["clean"])
    assert_clean_exit(runs["faulty"])
    assert_no_stop_timeout_waited(runs["faulty"], 5.0)


def test_tune_interval_reads_the_recovered_runs_timings(runs: dict[str, RunResult], tmp_path: Path) -> None:
    """``nvtrain tune-interval --from-run`` on the faulty run's directory: it measures the steps,
    the saves and the restarts of each layer from the events log and recommends an interval."""
    faulty = _ok(runs["faulty"])
    policy = write_policy(tmp_path / "faulty.toml", _tables(tmp_path / "ckpt"), FAULTS)
    runner = CliRunner()
    args = ["tune-interval", "--from-run", str(faulty.run_dir), "--mtbf", "6h", "--policy", str(policy)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    counts = data["measured"]["counts"]
    assert counts["step"] >= 4 and counts["save_block"] >= 4 and counts["save_write"] >= 2, counts
    in_process = sum(1 for f in FAULTS if f["kind"] in ("exception", "hang", "collective_hang"))
    assert (counts["restart_in_process"], counts["restart_in_job"]) == (in_process, len(FAULTS) - in_process)
    assert data["inputs"]["from"]["restart"].startswith("measured: in-job"), data["inputs"]["from"]
    assert 0 < data["inputs"]["step_s"] < 5
    best = data["recommended"]["async"]
    assert best["interval_steps"] >= best["floor_steps"]
    assert data["current"]["interval_steps"] == 5
    for outcome in (best, data["current"]["async"], data["current"]["sync"]):
        assert 0.0 <= outcome["efficiency"] <= 1.0

    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    assert "recommended  async" in shown.stdout and "current      async" in shown.stdout

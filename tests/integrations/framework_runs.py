"""What the per-framework tests share: one training script of ``bin/`` run twice under
``nvtrain run`` (2 gloo ranks), without faults and with an exception (in process), a SIGKILL
(in-job restart, warm, restored from the host copy) and a hang (soft timeout, in process), that
run then spending longer than the soft timeout after training; then the checks that the
recovered run is the fault-free run, and that the stretch after training was no fault.

Each script prints ``TRAIN step N loss X`` (rank 0, every step) and ``TRAIN rank R finished
fingerprint H`` (a hash of that rank's model, optimizer, scheduler and RNG states).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from support.worker_helpers import RunResult, assert_clean_exit, demo_tables, run_nvtrain, write_policy

BIN = Path(__file__).resolve().parent / "bin"
LOSS_LINE = re.compile(r"^TRAIN step (\d+) loss (-?\d+\.\d+)$", re.MULTILINE)
FINGERPRINT_LINE = re.compile(r"^TRAIN rank (\d+) finished fingerprint ([0-9a-f]{16})$", re.MULTILINE)

STEPS = 24
INTERVAL = 4
FAULTS = [
    {"step": 7, "rank": 1, "kind": "exception"},  # in-process restart, back to step 4
    {"step": 14, "rank": 0, "kind": "sigkill"},  # ft_launcher restarts both, warm, host copy of 12
    {"step": 19, "rank": 1, "kind": "hang"},  # soft timeout: in-process restart, back to 16
]
ONE_RANK_FAULTS = [
    {"step": 7, "rank": 0, "kind": "exception"},  # in-process restart, back to step 4 (mid-epoch)
    {"step": 14, "rank": 0, "kind": "sigkill"},  # a warm replacement, host copy of 12 (mid-epoch)
]
"""One rank: a single device's strategy and a plain ``RandomSampler``, whose order comes from
the process's RNG when the epoch's iterator is made (DDP's sampler is seeded by the epoch)."""
IN_PROCESS = ("exception", "hang")
LINGER = 7.0
"""Seconds of Python code the faulty run's script spends after training (``--linger``), longer
than the 5 s soft timeout: no step comes, and that must not be taken for a hang (it once was,
and ``main`` ran once more after a Lightning run on a GPU had finished)."""
RUN_TIMEOUT = 150.0


def tables(
    script: str, checkpoints: Path, out: Path, ranks: int = 2, linger: float = 0.0
) -> dict[str, dict[str, Any]]:
    """The policy of both runs: short timeouts that hold on a loaded 2-core machine (as the
    demo's fault-matrix runs), workers forked warm (the SIGKILL's replacements restore from the
    host copy)."""
    # The demo's fault-matrix timeouts (worker_helpers.demo_tables), with the framework script
    # as the job, warm workers and a smaller in-job budget.
    t = demo_tables(checkpoints, name="integration", ranks=ranks, steps=STEPS)
    del t["job"]["module"]
    args = ["--steps", str(STEPS), "--out", str(out), "--linger", str(linger)]
    t["job"] |= {"script": str(BIN / script), "args": args}
    t["job"]["warm_start"] = True
    t["restart.in_job"] = {"max_restarts": 3}
    t["checkpoint"]["interval"] = INTERVAL
    return t


def run_pair(
    tmp_path_factory: pytest.TempPathFactory,
    script: str,
    *,
    ranks: int = 2,
    faults: list[dict[str, Any]] = FAULTS,
) -> dict[str, RunResult]:
    """The fault-free run, then the faulty one (one after the other: two at once would trip the
    short timeouts on 2 cores), which lingers after training (``LINGER``)."""
    root = tmp_path_factory.mktemp(f"{Path(script).stem}-{ranks}")
    checkpoints = root / "ckpt"
    results = {}
    for name, chosen, linger in (("clean", [], 0.0), ("faulty", faults, LINGER)):
        t = tables(script, checkpoints, root / f"out-{name}", ranks, linger)
        policy = write_policy(root / f"{name}.toml", t, chosen)
        results[name] = run_nvtrain(policy, name, checkpoints, root, RUN_TIMEOUT)
    return results


def ok(run: RunResult) -> RunResult:
    assert_clean_exit(run)
    return run


def fingerprints(run: RunResult) -> dict[int, str]:
    found: dict[int, str] = {}
    for rank, digest in FINGERPRINT_LINE.findall(run.output):
        assert found.setdefault(int(rank), digest) == digest, f"rank {rank} printed two fingerprints"
    return found


def losses(run: RunResult) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for step, loss in LOSS_LINE.findall(run.output):
        found.setdefault(int(step), []).append(loss)
    return found


def check_same_state(runs: dict[str, RunResult], ranks: int = 2) -> None:
    """Bitwise the same model, optimizer, scheduler and RNG states on every rank."""
    clean, faulty = ok(runs["clean"]), ok(runs["faulty"])
    assert sorted(fingerprints(clean)) == list(range(ranks)), clean.describe()
    assert fingerprints(faulty) == fingerprints(clean), faulty.describe()


def check_same_losses(runs: dict[str, RunResult], faults: list[dict[str, Any]] = FAULTS) -> None:
    """The same loss at every step, replayed steps included (the data position came back)."""
    clean, faulty = ok(runs["clean"]), ok(runs["faulty"])
    reference = losses(clean)
    assert sorted(reference) == list(range(1, STEPS + 1)), clean.describe()
    assert all(len(v) == 1 for v in reference.values()), "the clean run replayed a step"
    printed = losses(faulty)
    assert sorted(printed) == list(range(1, STEPS + 1)), faulty.describe()
    wrong = {s: (v, reference[s][0]) for s, v in printed.items() if any(x != reference[s][0] for x in v)}
    assert wrong == {}, f"(faulty run's losses, clean loss) per step: {wrong}"
    # A fault fires at the end of its step, before the step's loss is logged (a collective
    # with the failing rank): the steps after the checkpoint it goes back to are printed twice.
    replayed = {step for step, values in printed.items() if len(values) > 1}
    events = faulty.events
    rolled_back = {s for f in _fired(events) for s in range(_restored_after(events, f) + 1, f["step"])}
    assert rolled_back <= replayed <= rolled_back | {f["step"] for f in faults}, sorted(replayed)


def _back_to(step: int) -> int:
    """The newest save before a fault at the end of ``step``."""
    return (step - 1) // INTERVAL * INTERVAL


def _fired(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "fault_injected"]


def _restored_after(events: list[dict[str, Any]], fault: dict[str, Any]) -> int:
    """The step the ranks restored after ``fault`` (the same on every rank, checked)."""
    ranks = len({e["rank"] for e in events if e["event"] == "worker_start"})
    restored = [e for e in events if e["event"] == "checkpoint_restored" and e["ts"] > fault["ts"]][:ranks]
    steps = {e["step"] for e in restored}
    assert ranks and len(restored) == ranks and len(steps) == 1, (fault, _summary(events))
    return int(steps.pop())


def _summary(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    kinds = ("fault_injected", "restart_begin", "restart_end", "checkpoint_restored", "worker_failed")
    return [
        (e["event"], e.get("rank"), e.get("layer"), e.get("origin"), e.get("step"), e.get("pid"))
        for e in events
        if e["event"] in kinds
    ]


def check_layers(runs: dict[str, RunResult]) -> None:
    """Each fault fired once and was recovered by its layer: the exception and the hang in the
    same processes, the SIGKILL by an in-job restart of warm workers that restored every rank
    from the host copy (memory)."""
    faulty = ok(runs["faulty"])
    events = faulty.events
    fired = _fired(events)
    assert Counter((e["step"], e["rank"], e["kind"]) for e in fired) == Counter(
        (f["step"], f["rank"], f["kind"]) for f in FAULTS
    ), _summary(events)
    for fault in fired:
        after = [e for e in events if e["ts"] > fault["ts"]]
        restored = [e for e in after if e["event"] == "checkpoint_restored"][:2]
        assert len(restored) == 2, (fault, _summary(events))
        if fault["kind"] in IN_PROCESS:
            same = [e for e in after if e["event"] == "restart_end" and e["pid"] == fault["pid"]]
            assert same and same[0].get("layer") == "in_process", (fault, _summary(events))
            assert fault["pid"] in {e["pid"] for e in restored}, (fault, _summary(events))
        else:
            starts = [e for e in after if e["event"] == "worker_start"][:2]
            assert len(starts) == 2 and all(e.get("warm") is True for e in starts), starts
            assert fault["pid"] not in {e["pid"] for e in restored}, (fault, _summary(events))
            assert {e["origin"] for e in restored} == {"memory"}, restored
        # The newest save before the fault, or the one before it when the newest was still in
        # flight: a SIGKILL does not wait for it, and an in-process restart waits a bounded time
        # ([checkpoint] finish_in_flight), which a loaded machine may overrun.
        newest = _back_to(fault["step"])
        assert _restored_after(events, fault) in (newest, newest - INTERVAL), (fault, restored)


def check_one_incident_per_fault(runs: dict[str, RunResult], faults: list[dict[str, Any]]) -> None:
    """``nvtrain report`` finds one recovered incident per fault, and none after training."""
    from nvtrain.report import read_report

    report = read_report(ok(runs["faulty"]).run_dir)
    incidents = report.incidents
    assert len(incidents) == len(faults) and all(i.recovered for i in incidents), incidents


def check_events_feed_the_report(runs: dict[str, RunResult]) -> None:
    """Steps, saves and restores are in the events log: ``nvtrain report`` finds every incident
    recovered by its layer, and ``tune-interval --from-run`` measures steps, saves and restarts
    from it."""
    from nvtrain.report import read_report

    faulty = ok(runs["faulty"])
    events = faulty.events
    committed = {e["step"] for e in events if e["event"] == "checkpoint_committed"}
    # Every interval's save is committed, but one whose write to storage was still in flight
    # when a SIGKILL came, and that the replacements then restored from its host copy: training
    # goes on from it, and it is never written again (seen on a loaded machine: step 12).
    killed = [f for f in _fired(events) if f["kind"] not in IN_PROCESS]
    from_memory = {_restored_after(events, f) for f in killed}
    missing = set(range(INTERVAL, STEPS + 1, INTERVAL)) - committed
    assert missing <= from_memory, (sorted(committed), sorted(from_memory))
    staged = [e for e in events if e["event"] == "checkpoint_staged"]
    assert staged and all(e["blocked_s"] >= 0 and e["bytes"] > 0 for e in staged), staged[:2]
    report = read_report(faulty.run_dir)
    assert report.final_step == STEPS, report
    assert len(report.incidents) == len(FAULTS), report.incidents
    assert all(i.recovered for i in report.incidents), report.incidents
    assert Counter(i.layer for i in report.incidents) == Counter(
        "in_process" if f["kind"] in IN_PROCESS else "in_job" for f in FAULTS
    ), report.incidents
    from typer.testing import CliRunner

    from nvtrain.cli import app

    args = ["tune-interval", "--from-run", str(faulty.run_dir), "--mtbf", "6h", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)["measured"]["counts"]
    in_process = sum(1 for f in FAULTS if f["kind"] in IN_PROCESS)
    assert (counts["restart_in_process"], counts["restart_in_job"]) == (in_process, len(FAULTS) - in_process)
    assert counts["step"] >= STEPS // 2 and counts["save_block"] >= STEPS // INTERVAL, counts

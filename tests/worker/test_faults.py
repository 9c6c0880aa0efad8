"""Fault injection (``nvtrain.worker.faults``): every kind fires once per run, also when its step
is replayed after a restart (in process or in a new process), and only at its step on its rank.

The kinds that end or block the process run in a child (``bin/fire_fault.py``); the markers live
in ``<run dir>/faults``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nvtrain.config.schema import Fault
from nvtrain.events import Event, EventLog, read_events
from support.waiting import wait_until
from support.worker_helpers import BIN, child_env


def _fire(run_dir: Path, faults: list[dict[str, Any]], step: int, rank: int) -> subprocess.Popen[str]:
    argv = [
        sys.executable,
        str(BIN / "fire_fault.py"),
        str(run_dir / "faults"),
        str(run_dir / "events.jsonl"),
        json.dumps(faults),
        str(step),
        str(rank),
    ]
    return subprocess.Popen(
        argv,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise
    return proc.returncode, out


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def _fired(run_dir: Path) -> list[tuple[int, int, str]]:
    path = run_dir / "events.jsonl"
    if not path.is_file():
        return []
    return [
        (e["step"], e["rank"], e["kind"])
        for e in map(Event.as_dict, read_events(path))
        if e["event"] == "fault_injected"
    ]


def _markers(run_dir: Path) -> list[str]:
    folder = run_dir / "faults"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


# What the first firing does to the process: (exit code, text in the output) or "blocks".
OUTCOMES: dict[str, tuple[int, str] | str] = {
    "exception": (1, "InjectedFault: injected exception at step 7 on rank 1"),
    "sigkill": (-signal.SIGKILL, "BEFORE"),
    "oom": (137, "BEFORE"),
    "sigterm": (-signal.SIGTERM, "BEFORE"),
    "hang": "blocks",
    "collective_hang": "blocks",  # no process group here: it blocks like a hang
}


@pytest.mark.parametrize("kind", sorted(OUTCOMES))
def test_a_fault_fires_once_and_not_again_when_its_step_is_replayed(tmp_path: Path, kind: str) -> None:
    run_dir = tmp_path / "run"
    faults = [{"step": 7, "rank": 1, "kind": kind}]
    first = _fire(run_dir, faults, step=7, rank=1)
    expected = OUTCOMES[kind]
    if expected == "blocks":
        wait_until(
            lambda: _fired(run_dir), 60, f"marker of the {kind} fault", alive=lambda: first.poll() is None
        )
        try:  # fired: the process must now block (it would exit at once if the fault returned)
            first.wait(timeout=1.0)
            still_running = False
        except subprocess.TimeoutExpired:
            still_running = True
        _kill(first)
        assert still_running, f"the {kind} fault did not block the process"
    else:
        code, out = _finish(first)
        assert (code, expected[1] in out) == (expected[0], True), out
        assert "AFTER" not in out
    assert _fired(run_dir) == [(7, 1, kind)]
    assert _markers(run_dir) == ["0.fired"]

    # The restarted worker replays step 7: the marker says the fault already fired.
    code, out = _finish(_fire(run_dir, faults, step=7, rank=1))
    assert (code, out.split()) == (0, ["BEFORE", "AFTER"]), out
    assert _fired(run_dir) == [(7, 1, kind)]
    assert _markers(run_dir) == ["0.fired"]


def _injector(run_dir: Path, faults: list[dict[str, Any]]) -> Any:
    from nvtrain.worker.faults import FaultInjector

    log = EventLog(run_dir / "events.jsonl", run_id="faults", source="test")
    return FaultInjector([Fault.model_validate(f) for f in faults], run_dir / "faults", log)


def test_a_fault_for_another_rank_or_step_does_not_fire(tmp_path: Path) -> None:
    from nvtrain.worker import InjectedFault

    run_dir = tmp_path / "run"
    injector = _injector(run_dir, [{"step": 5, "rank": 1, "kind": "exception"}])
    for step in range(1, 11):
        injector.maybe_fire(step, rank=0)  # another rank: never
    for step in (4, 6, 50):
        injector.maybe_fire(step, rank=1)  # another step: never
    assert _fired(run_dir) == [] and _markers(run_dir) == []
    with pytest.raises(InjectedFault, match="step 5 on rank 1"):
        injector.maybe_fire(5, rank=1)
    assert _fired(run_dir) == [(5, 1, "exception")]


def test_an_exception_fault_fires_once_across_in_process_and_new_process_restarts(tmp_path: Path) -> None:
    from nvtrain.worker import InjectedFault

    run_dir = tmp_path / "run"
    faults = [{"step": 3, "rank": 0, "kind": "exception"}]
    injector = _injector(run_dir, faults)
    with pytest.raises(InjectedFault):
        injector.maybe_fire(3, rank=0)
    injector.maybe_fire(3, rank=0)  # in-process restart: the same injector replays step 3
    _injector(run_dir, faults).maybe_fire(3, rank=0)  # a new worker process: a new injector
    assert _fired(run_dir) == [(3, 0, "exception")]


def test_every_fault_of_the_list_fires_once_on_its_own_marker(tmp_path: Path) -> None:
    from nvtrain.worker import InjectedFault

    run_dir = tmp_path / "run"
    faults = [
        {"step": 3, "rank": 0, "kind": "exception"},
        {"step": 3, "rank": 1, "kind": "exception"},
        {"step": 8, "rank": 0, "kind": "exception"},
    ]
    raised = []
    for attempt in range(3):  # the run is replayed from the start three times
        injector = _injector(run_dir, faults)
        for step in range(1, 11):
            for rank in (0, 1):
                try:
                    injector.maybe_fire(step, rank)
                except InjectedFault:
                    raised.append((attempt, step, rank))
    assert raised == [(0, 3, 0), (0, 3, 1), (0, 8, 0)]
    assert _markers(run_dir) == ["0.fired", "1.fired", "2.fired"]
    assert _fired(run_dir) == [(3, 0, "exception"), (3, 1, "exception"), (8, 0, "exception")]


def test_a_new_run_fires_its_faults_again(tmp_path: Path) -> None:
    """Once per run, not once ever: another run id has its own markers."""
    from nvtrain.worker import InjectedFault

    faults = [{"step": 2, "rank": 0, "kind": "exception"}]
    for run in ("run-a", "run-b"):
        with pytest.raises(InjectedFault):
            _injector(tmp_path / run, faults).maybe_fire(2, rank=0)
        assert _fired(tmp_path / run) == [(2, 0, "exception")]

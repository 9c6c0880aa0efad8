"""How a run ends: exit codes and root causes (``launcher.outcome.decide``), and the escalation
rule for scripts that report no steps (the supervisor's watch, fed real ft_launcher lines).

The log lines are NVRx 0.4.1's own (see test_logwatch.py); a hand-driven clock stands for time.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode
from nvtrain.events import EventLog
from nvtrain.launcher.identity import Identity, identify
from nvtrain.launcher.outcome import decide
from nvtrain.launcher.supervisor import _Watch
from nvtrain.nvrx import NvrxVersion

ENDPOINT = "trainer-0.trainer.default.svc.cluster.local:29500"
V041, V060, V070 = (NvrxVersion.parse(v) for v in ("0.4.1", "0.6.0", "0.7.0"))


def policy(nodes: int = 2, min_nodes: int | None = None, escalate_after: int = 2) -> Policy:
    return Policy.model_validate(
        {
            "job": {"name": "trainer", "script": "train.py"},
            "rendezvous": {"nodes": nodes, "min_nodes": min_nodes, "join_timeout": "5s"},
            "heartbeat": {"initial_timeout": "20s", "timeout": "4s"},
            "restart": {"escalate_after": escalate_after, "in_job": {"max_restarts": 5}},
        }
    )


def identity(p: Policy) -> Identity:
    return identify(p, {"JOB_COMPLETION_INDEX": "0", "NVTRAIN_RUN_ID": "run-1"}, hostname="trainer-0")


@dataclasses.dataclass
class Seen:
    """What the supervisor saw (the ``Observed`` protocol), built by hand."""

    signum: int | None = None
    escalated: str | None = None
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    restarts: int = 0
    launcher_error: str | None = None
    rendezvous_timeout: bool = False
    world_nodes: int | None = None


FAILURE = {"local_rank": 1, "worker_pid": 4242, "exit_code": 3, "signal": None}


# -- NVRx 0.7's "do not restart" exit code -----------------------------------------------------


def test_exit_93_from_nvrx_07_is_never_retried() -> None:
    p = policy()
    outcome = decide(93, Seen(failures=[dict(FAILURE)], restarts=2), p, identity(p), ENDPOINT, V070)
    assert outcome.exit_code == ExitCode.ESCALATED == 4
    assert "NVRx 0.7.0 ended the run on pod trainer-0 (node 0) with exit code 93" in outcome.cause
    assert "local rank 1" in outcome.cause and "exit code 3" in outcome.cause
    assert "not retrying" in outcome.cause


@pytest.mark.parametrize("nvrx", [V041, V060, None])
def test_exit_93_before_nvrx_07_is_an_ordinary_failure(nvrx: NvrxVersion | None) -> None:
    p = policy()
    outcome = decide(93, Seen(), p, identity(p), ENDPOINT, nvrx)
    assert outcome.exit_code == ExitCode.FAILED
    assert "ft_launcher exited with code 93" in outcome.cause


def test_a_signal_still_beats_exit_93() -> None:
    p = policy()
    assert decide(93, Seen(signum=15), p, identity(p), ENDPOINT, V070).exit_code == 143


# -- rendezvous not completed within join_timeout -----------------------------------------------


def test_rendezvous_timeout_exits_3_and_says_where_and_why() -> None:
    p = policy()
    seen = Seen(launcher_error="e=RendezvousTimeoutError()", rendezvous_timeout=True)
    outcome = decide(1, seen, p, identity(p), ENDPOINT, V041)
    assert outcome.exit_code == ExitCode.RENDEZVOUS == 3
    cause = outcome.cause
    assert cause.startswith("rendezvous not completed in time on pod trainer-0 (node 0)")
    assert f"the rendezvous at {ENDPOINT} (run id run-1) needs 2 node(s)" in cause
    assert "[rendezvous] join_timeout = 5s" in cause
    assert "this node joined, and NVRx does not log how many others did" in cause
    for hint in ("not scheduled", "NetworkPolicy", "TCP port 29500", "NVTRAIN_RUN_ID"):
        assert hint in cause


def test_rendezvous_timeout_with_an_elastic_range_and_an_earlier_round() -> None:
    p = policy(nodes=4, min_nodes=3)
    seen = Seen(failures=[dict(FAILURE)], rendezvous_timeout=True, world_nodes=4, restarts=1)
    outcome = decide(1, seen, p, identity(p), ENDPOINT, V041)
    assert outcome.exit_code == 3
    assert "needs at least 3 of 4 node(s)" in outcome.cause
    assert "the last completed round had 4 node(s)" in outcome.cause
    # the worker failure that led to the new round is still named
    assert "Before that: local rank 1 on pod trainer-0 (node 0), exit code 3" in outcome.cause


def test_other_launcher_errors_stay_exit_1() -> None:
    p = policy()
    seen = Seen(launcher_error="e=RendezvousConnectionError('store')")
    outcome = decide(1, seen, p, identity(p), ENDPOINT, V041)
    assert outcome.exit_code == 1
    assert "ft_launcher failed on pod trainer-0 (node 0): e=RendezvousConnectionError" in outcome.cause


# -- escalation for scripts that report no steps --------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def joined(round_: int) -> str:
    return (
        f"[2026-11-29 10:23:33,685] [INFO] [ft_launcher9108@vm] The node 'vm_9108_0' has joined "
        f"round {round_} of the rendezvous 'b1' as rank 0 in a world of size 1."
    )


def failed(pid: int, local_rank: int = 1) -> str:
    return (
        f"[2026-11-29 10:24:14,414] [ERROR] [ft_launcher9527@vm] failed (exitcode: 3) local_rank: "
        f"{local_rank} (pid: {pid}) of binary: /usr/bin/python"
    )


@pytest.fixture
def watch(tmp_path: Path) -> tuple[_Watch, Clock]:
    clock = Clock()
    events = EventLog(tmp_path / "events.jsonl", node=0, run_id="run-1", source="launcher")
    return _Watch(policy(escalate_after=2), events, lambda event, fields: None, clock=clock), clock


def run_attempts(w: _Watch, clock: Clock, durations: list[float], *, wait: float = 1.0) -> list[bool]:
    """Each attempt: a rendezvous after ``wait`` seconds, then local rank 1 fails after the
    given duration. Returns whether the run had escalated after each failure."""
    escalated = []
    for attempt, duration in enumerate(durations):
        clock.now += wait
        w.line(joined(attempt))
        clock.now += duration
        w.line(failed(5000 + len(w.failures)))  # a new pid each time
        escalated.append(w.escalated is not None)
    return escalated


def test_quick_failures_of_the_same_rank_escalate(watch: tuple[_Watch, Clock]) -> None:
    w, clock = watch
    assert run_attempts(w, clock, [2.0, 2.0]) == [False, True]
    assert w.escalated is not None
    assert "local rank 1 failed 2 times in a row" in w.escalated
    assert "[heartbeat] initial_timeout = 20s" in w.escalated


def test_attempts_that_ran_past_initial_timeout_count_as_progress(watch: tuple[_Watch, Clock]) -> None:
    # benchmarks/recovery/RESULTS.md: a plain torchrun script failing at steps 15, 30 and 45 of
    # 60 was stopped with exit 4 although it made progress between the failures.
    w, clock = watch
    assert run_attempts(w, clock, [30.0, 25.0, 20.0]) == [False, False, False]
    # ...and progress only resets the count: two quick failures after it escalate again.
    assert run_attempts(w, clock, [1.0]) == [True]


def test_waiting_for_the_rendezvous_is_not_progress(watch: tuple[_Watch, Clock]) -> None:
    # The attempt runs from its completed rendezvous, not from the restart: a long wait for the
    # other nodes followed by a quick failure is no progress.
    w, clock = watch
    assert run_attempts(w, clock, [1.0, 1.0], wait=60.0) == [False, True]

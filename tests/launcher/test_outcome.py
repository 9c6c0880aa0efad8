"""How a run ends: exit codes and root causes (``launcher.outcome.decide``) from what the
supervisor saw, built by hand. The supervisor's loop itself: test_supervisor_seam.py."""

from __future__ import annotations

import dataclasses

import pytest

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode
from nvtrain.events.records import HangBlamed, WorkerEnded, WorkerFailed
from nvtrain.launcher.identity import Identity, identify
from nvtrain.launcher.outcome import decide
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
    failures: list[WorkerFailed] = dataclasses.field(default_factory=list)
    ended: list[WorkerEnded] = dataclasses.field(default_factory=list)
    restarts: int = 0
    launcher_error: str | None = None
    rendezvous_timeout: bool = False
    world_nodes: int | None = None
    blames: list[HangBlamed] = dataclasses.field(default_factory=list)


FAILURE = WorkerFailed(local_rank=1, worker_pid=4242, exit_code=3)


# -- NVRx 0.7's "do not restart" exit code -----------------------------------------------------


def test_exit_93_from_nvrx_07_is_never_retried() -> None:
    p = policy()
    outcome = decide(93, Seen(failures=[FAILURE], restarts=2), p, identity(p), ENDPOINT, V070)
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
    seen = Seen(failures=[FAILURE], rendezvous_timeout=True, world_nodes=4, restarts=1)
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


# -- the root cause ------------------------------------------------------------------------------


def test_a_worker_that_was_told_to_stop_is_passed_over_for_the_root_cause() -> None:
    p = policy()
    stopped = WorkerEnded(local_rank=0, worker_pid=4241, exit_code=-15, signal="SIGTERM", reason="stopped")
    outcome = decide(1, Seen(failures=[FAILURE], ended=[stopped]), p, identity(p), ENDPOINT, V041)
    assert "Root cause (first failure): local rank 1 on pod trainer-0 (node 0), exit code 3 (pid 4242)" in (
        outcome.cause
    )
    assert "1 worker failure(s) in all, 1 more ended when told to stop" in outcome.cause


def test_when_every_worker_ended_when_told_to_stop_the_first_is_named_as_such() -> None:
    p = policy()
    stopped = WorkerEnded(local_rank=0, worker_pid=4241, exit_code=-15, signal="SIGTERM", reason="stopped")
    outcome = decide(1, Seen(ended=[stopped]), p, identity(p), ENDPOINT, V041)
    assert (
        "local rank 0 on pod trainer-0 (node 0), killed by SIGTERM after it was told to stop (pid 4241)"
        in (outcome.cause)
    )
    assert "0 worker failure(s) in all, 1 more ended when told to stop" in outcome.cause


def test_a_worker_that_raised_and_then_aborted_at_exit_is_named_with_its_exception() -> None:
    """torch's threads can end a worker's exit with std::terminate (SIGABRT) after its
    traceback was printed: the exception stays in the root cause (seen under load in
    test_run_root_cause)."""
    p = policy()
    aborted = WorkerFailed(
        local_rank=1, worker_pid=5881, exit_code=-6, signal="SIGABRT", raised="RuntimeError: boom at step 10"
    )
    outcome = decide(1, Seen(failures=[aborted]), p, identity(p), ENDPOINT, V041)
    named = "local rank 1 on pod trainer-0 (node 0), killed by SIGABRT after it raised RuntimeError: boom"
    assert f"{named} at step 10 (pid 5881)" in outcome.cause


# -- a hang blamed on the stopped worker ----------------------------------------------------------


BLAMED = HangBlamed(
    source="launcher", rank=1, local_rank=1, worker_pid=4343, state="stopped", signal="SIGKILL"
)
HUNG_PEER = WorkerFailed(local_rank=0, worker_pid=4242, signal="SIGKILL", hang=True)
KILLED_STOPPED = WorkerFailed(local_rank=1, worker_pid=4343, signal="SIGKILL")


@pytest.mark.parametrize(
    "failures",
    [[HUNG_PEER, KILLED_STOPPED], [KILLED_STOPPED, HUNG_PEER]],
    ids=["peer-first", "stopped-first"],
)
def test_a_blamed_hang_is_the_root_cause_whichever_end_ft_launcher_reports_first(
    failures: list[WorkerFailed],
) -> None:
    """Under load ft_launcher may report the end of the stopped worker (nvtrain's SIGKILL) before
    that of the peer whose rank monitor fired: the hang is the root cause either way."""
    p = policy()
    seen = Seen(failures=failures, blames=[BLAMED])
    outcome = decide(1, seen, p, identity(p), ENDPOINT, V041)
    assert "Root cause (first failure): a hang in local rank 1 " in outcome.cause, outcome.cause
    assert "its process was stopped" in outcome.cause, outcome.cause


def test_a_blame_does_not_take_over_an_unrelated_first_failure() -> None:
    """A first failure that is neither a hang nor the blamed worker's end stays the root cause."""
    p = policy()
    crashed = WorkerFailed(local_rank=0, worker_pid=4141, exit_code=3)
    outcome = decide(
        1, Seen(failures=[crashed, KILLED_STOPPED], blames=[BLAMED]), p, identity(p), ENDPOINT, V041
    )
    assert "Root cause (first failure): local rank 0 on pod trainer-0 (node 0), exit code 3" in outcome.cause

"""Escalation and hang blame as ``Watch``, ``logwatch`` and ``outcome`` decide them (issue 39):
a failure before the first step that repeats with the same error stops the run early, with the
script's error; a script's traceback is told from the launcher's by its frames; a blamed hang
names the stopped rank, or every rank it may be in."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode
from nvtrain.events import EventTail
from nvtrain.events.records import HangBlamed, WorkerFailed
from nvtrain.launcher.identity import identify
from nvtrain.launcher.logwatch import LogSorter, PlainTraceback, script_frame
from nvtrain.launcher.outcome import decide
from nvtrain.launcher.stalls import Stalls, state_of, tree
from nvtrain.launcher.watch import Watch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def policy(tmp_path: Path, escalate_after: int = 3) -> Policy:
    return Policy.model_validate(
        {
            "job": {"name": "trainer", "script": "train.py", "nproc_per_node": 2},
            "heartbeat": {"initial_timeout": "20s", "timeout": "4s"},
            "restart": {"escalate_after": escalate_after, "in_job": {"max_restarts": 10}},
            "checkpoint": {"dir": str(tmp_path / "ckpt")},
        }
    )


def watch(tmp_path: Path, escalate_after: int = 3) -> Watch:
    clock = Clock()
    w = Watch(policy(tmp_path, escalate_after), EventTail(tmp_path / "events.jsonl"), lambda r: None,
              node=0, host="vm", clock=clock)  # fmt: skip
    w.launcher_started()
    return w


def joined(n: int) -> str:
    return (
        f"[2026-11-29 10:23:33,685] [INFO] [ft_launcher9108@vm] The node 'vm_9108_0' has joined "
        f"round {n} of the rendezvous 'b1' as rank 0 in a world of size 1.\n"
    )


def failed(pid: int, code: int = 1) -> str:
    return (
        f"[2026-11-29 10:24:14,414] [ERROR] [ft_launcher9527@vm] failed (exitcode: {code}) local_rank: "
        f"1 (pid: {pid}) of binary: /usr/bin/python\n"
    )


def traceback(error: str, path: str = "/work/train.py") -> list[str]:
    return [
        "Traceback (most recent call last):\n",
        f'  File "{path}", line 3, in <module>\n',
        "    main()\n",
        f"{error}\n",
    ]


def attempt(w: Watch, n: int, error: str | None, path: str = "/work/train.py") -> None:
    w.line(joined(n), stream="stderr")
    for line in traceback(error, path) if error else []:
        w.line(line, stream="stderr")
    w.line(failed(5000 + n), stream="stderr")


def test_the_same_startup_error_twice_escalates_at_the_second_failure(tmp_path: Path) -> None:
    w = watch(tmp_path, escalate_after=5)
    attempt(w, 0, "ValueError: unknown option 'lr_shedule'")
    assert w.escalated is None
    attempt(w, 1, "ValueError: unknown option 'lr_shedule'")
    assert w.escalated is not None and w.escalated_early
    assert "local rank 1 failed 2 times in a row before the first step" in w.escalated
    assert w.escalated_error == "ValueError: unknown option 'lr_shedule'"
    assert w.escalated_failures == 2


def test_different_errors_escalate_at_the_configured_count(tmp_path: Path) -> None:
    w = watch(tmp_path, escalate_after=3)
    for n in range(2):
        attempt(w, n, f"ValueError: attempt {n}")
    assert w.escalated is None
    attempt(w, 2, "ValueError: attempt 2")
    assert w.escalated is not None and not w.escalated_early
    assert "failed 3 times in a row" in w.escalated and w.escalated_failures == 3
    assert w.escalated_error == "ValueError: attempt 2"


def test_failures_without_a_known_error_are_counted_only(tmp_path: Path) -> None:
    w = watch(tmp_path, escalate_after=3)
    for n in range(2):
        attempt(w, n, None)
    assert w.escalated is None


def test_the_same_error_from_a_peer_is_counted_only(tmp_path: Path) -> None:
    # A rank that cannot reach the store while another pod is not up yet fails the same way on
    # each attempt; that may clear: it is not stopped early.
    w = watch(tmp_path, escalate_after=3)
    for n in range(2):
        attempt(w, n, "torch.distributed.DistNetworkError: Connection reset by peer")
    assert w.escalated is None


def test_a_traceback_of_the_launchers_own_frames_is_not_the_scripts(tmp_path: Path) -> None:
    w = watch(tmp_path, escalate_after=5)
    library = "/venv/lib/python3.11/site-packages/nvidia_resiliency_ext/fault_tolerance/utils.py"
    for n in range(2):
        attempt(w, n, "asyncio.exceptions.CancelledError", path=library)
    assert w.escalated is None


def test_the_escalation_cause_carries_the_scripts_error(tmp_path: Path) -> None:
    w = watch(tmp_path, escalate_after=3)
    for n in range(3):
        attempt(w, n, f"KeyError: 'step{n}'")
    p = policy(tmp_path)
    identity = identify(p, {"JOB_COMPLETION_INDEX": "0", "NVTRAIN_RUN_ID": "r"}, hostname="trainer-0")
    outcome = decide(1, w, p, identity, "h:1", None)
    assert outcome.exit_code == ExitCode.ESCALATED
    assert "[restart] escalate_after = 3); the script's error: KeyError: 'step2'" in outcome.cause


# -- tracebacks ----------------------------------------------------------------------------------


def test_a_scripts_traceback_after_an_info_record_is_the_scripts() -> None:
    sorter = LogSorter()
    info = "[2026-12-05 04:23:02,485] [INFO] [ft_launcher5834@vm] Environment variable 'X' not found.\n"
    lines = [info, *traceback("ValueError: bad", "/work/main/train.py")]
    # The first line is held as the launcher's (the supervisor shows it once the next is not).
    assert [sorter.sort(line) for line in lines] == [(True, False), (True, False)] + [(False, True)] * 3


def test_a_plain_traceback_gives_its_last_exception() -> None:
    reader = PlainTraceback()
    lines = [
        *traceback("KeyError: 'x'"),
        "\n",
        "During handling of the above exception, another exception occurred:\n",
        "\n",
        *traceback("RuntimeError: wrapped"),
    ]
    assert [e for e in map(reader.feed, lines) if e] == ["KeyError: 'x'", "RuntimeError: wrapped"]


@pytest.mark.parametrize(
    ("line", "mine"),
    [
        ('  File "/work/train.py", line 3, in <module>', True),
        ('  File "/venv/lib/python3.11/site-packages/torch/x.py", line 3, in f', False),
        ('  File "<frozen runpy>", line 88, in _run_code', False),
        (f'  File "{os.path.dirname(os.__file__)}/asyncio/events.py", line 80, in _run', False),
        ("    main()", False),
    ],
)
def test_script_frames(line: str, mine: bool) -> None:
    assert script_frame(line) is mine


# -- hang blame ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Seen:
    signum: int | None = None
    escalated: str | None = None
    failures: list[WorkerFailed] = dataclasses.field(default_factory=list)
    restarts: int = 0
    launcher_error: str | None = None
    rendezvous_timeout: bool = False
    world_nodes: int | None = None
    blames: list[HangBlamed] = dataclasses.field(default_factory=list)


HEALTHY = WorkerFailed(local_rank=0, worker_pid=11, exit_code=-9, signal="SIGKILL", hang=True)


def cause(tmp_path: Path, blame: HangBlamed) -> str:
    p = policy(tmp_path)
    identity = identify(p, {"JOB_COMPLETION_INDEX": "0", "NVTRAIN_RUN_ID": "r"}, hostname="trainer-0")
    return decide(1, Seen(failures=[HEALTHY], blames=[blame]), p, identity, "h:1", None).cause


def test_the_root_cause_of_a_hang_names_the_stopped_rank(tmp_path: Path) -> None:
    text = cause(tmp_path, HangBlamed(rank=1, local_rank=1, worker_pid=12, state="stopped", signal="SIGKILL"))
    assert "Root cause (first failure): a hang in local rank 1 on pod trainer-0 (node 0) (pid 12)" in text
    assert "ended with SIGKILL" in text and "The first failure seen: local rank 0" in text
    assert "OOM" not in text


def test_a_hang_nothing_tells_apart_names_every_rank(tmp_path: Path) -> None:
    text = cause(tmp_path, HangBlamed(candidates=(0, 1)))
    assert "Root cause (first failure): a hang in one of local ranks 0, 1 on pod trainer-0" in text


def test_stalls_finds_a_stopped_worker_with_its_ranks_and_kills_it() -> None:
    env = {**os.environ, "RANK": "3", "LOCAL_RANK": "1"}
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        os.kill(worker.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while state_of(worker.pid) != "T":  # the kernel stops it at once; no sleep to wait on
            assert time.monotonic() < deadline, state_of(worker.pid)
            os.sched_yield()
        spared = [pid for pid in tree(os.getpid()) if pid != worker.pid]
        stalls = Stalls()
        stalls.look(spared)
        [(stalled, killed)] = stalls.take(spared)
        assert (stalled.pid, stalled.state, stalled.rank, stalled.local_rank) == (worker.pid, "stopped", 3, 1)
        assert killed and worker.wait(timeout=10) == -signal.SIGKILL
        assert stalls.take(spared) == []
    finally:
        worker.kill()
        worker.wait()


def test_the_report_names_the_rank_a_hang_was_blamed_on() -> None:
    from nvtrain.events.records import HangDetected, Step
    from nvtrain.runlog.recoveries import find_recoveries

    def events(blame: HangBlamed) -> list:
        return [
            Step(ts=1.0, step=5, step_s=0.1, rank=0),
            HangDetected(ts=2.0, rank=0, heartbeat="subsequent", source="launcher"),
            dataclasses.replace(HEALTHY, ts=2.1, source="launcher"),
            dataclasses.replace(blame, ts=2.2, source="launcher"),
            Step(ts=5.0, step=6, rank=0),
        ]

    stopped = HangBlamed(rank=1, local_rank=1, state="stopped", signal="SIGKILL")
    [recovery] = find_recoveries(events(stopped), frozenset())
    assert (recovery.cause_kind, recovery.cause) == ("hang", "hang (rank 1, stopped)")
    [recovery] = find_recoveries(events(HangBlamed(candidates=(0, 1))), frozenset())
    assert recovery.cause == "hang (in one of local ranks 0, 1)"

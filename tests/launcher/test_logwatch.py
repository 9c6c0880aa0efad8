"""ft_launcher log lines -> events. Every line here was copied from a real NVRx 0.4.1 run
(torch 2.13 CPU, gloo, 2 ranks) of ``nvtrain run``; only the dates say when."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from nvtrain.launcher.logwatch import (
    RENDEZVOUS_TIMEOUT,
    LogSorter,
    Raised,
    caused_by_peer,
    read_raised,
    signal_name,
)
from nvtrain.launcher.logwatch import parse_line as parse_event_line


def parse_line(line: str) -> tuple[str, dict[str, Any]] | None:
    """``(event, set fields)`` of the record ``parse_line`` makes of ``line``."""
    event = parse_event_line(line)
    if event is None:
        return None
    return event.name, {**({"rank": event.rank} if event.rank is not None else {}), **event.fields()}


# A worker SIGKILLed by itself (or by its rank monitor after a missed heartbeat).
SIGKILLED = (
    "[2026-11-29 10:23:33,190] [ERROR] [ft_launcher9108@vm] failed (exitcode: -9) local_rank: 1 "
    "(pid: 9117) of binary: /tmp/venv1/bin/python"
)
EXITED_3 = (
    "[2026-11-29 10:24:14,414] [ERROR] [ft_launcher9527@vm] failed (exitcode: 3) local_rank: 1 "
    "(pid: 9546) of binary: /tmp/venv1/bin/python"
)
# One rank failed while the other was still running.
UNHEALTHY = (
    "[2026-11-29 10:23:33,190] [INFO] [ft_launcher9108@vm] [default] Worker group UNHEALTHY. "
    "2/2 attempts left; will restart worker group"
)
# Every local rank had failed by ft_launcher's poll (here: both ranks exited with code 2).
FAILED_GROUP = (
    "[2026-11-29 10:21:23,109] [INFO] [ft_launcher7559@vm] [default] Worker group FAILED. "
    "2/2 attempts left; will restart worker group"
)
# [restart.in_job] policy = "min-healthy" (NVRx 0.4 only) logs its restarts differently.
MIN_HEALTHY_RESTART = (
    "[2026-11-29 10:26:55,022] [INFO] [ft_launcher11602@vm] 1/1 restart attempts left; "
    "restarting worker group..."
)
JOINED = (
    "[2026-11-29 10:23:33,685] [INFO] [ft_launcher9108@vm] The node 'localhost_9108_0' has joined "
    "round 1 of the rendezvous 'b1' as rank 0 in a world of size 1."
)
AGENT_ERROR = (
    "[2026-11-29 10:21:12,004] [ERROR] [ft_launcher7418@vm] Agent run ended with exception, "
    "e=RendezvousConnectionError('The connection to the C10d store has failed. See inner exception "
    "for details.'). Agent's exit code = 1"
)
IGNORED = [
    "[2026-11-29 10:23:33,190] [INFO] [ft_launcher9108@vm] Stopping workers... Timeout = 3.0 sec.",
    "[2026-11-29 10:23:51,003] [WARNING] [RankMonServer9210@vm:1] FT timeout elapsed.",
    "[2026-11-29 10:24:14,432] [WARNING] [ft_launcher9527@vm] Sending process 9545 closing signal SIGTERM",
    "[2026-11-29 10:23:30,007] [INFO] [ft_launcher9108@vm] The node 'localhost_9108_0' attempts to join "
    "the next round of the rendezvous 'b1'.",
    "[2026-11-29 10:21:53,171] [INFO] [ft_launcher7714@vm] [default] worker group successfully finished. "
    "Waiting 300 seconds for other agents to finish.",
    "[2026-11-29 10:21:53,288] [INFO] [ft_launcher7714@vm] Agent exits with exit code = 0.",
    "[2026-11-29 10:24:17,697] [ERROR] [ft_launcher9527@vm] Some rank(s) exited with non-zero exit code: "
    "{1: ProcessFailure(local_rank=1, pid=9559, exitcode=3, error_file='<N/A>', error_file_data="
    "{'message': '<NONE>'}, message='To enable traceback see: https://pytorch.org/docs/stable/elastic/"
    "errors.html', timestamp=1795947857)}",
    "DEMO rank 0/2 started (restart 0, pid 7789)",
    "",
]


def test_sigkilled_worker() -> None:
    assert parse_line(SIGKILLED) == (
        "worker_failed",
        {"local_rank": 1, "worker_pid": 9117, "exit_code": -9, "signal": "SIGKILL"},
    )


def test_worker_exit_code() -> None:
    assert parse_line(EXITED_3) == (
        "worker_failed",
        {"local_rank": 1, "worker_pid": 9546, "exit_code": 3, "signal": None},
    )


def test_restart_of_an_unhealthy_group() -> None:
    assert parse_line(UNHEALTHY) == (
        "restart_begin",
        {"layer": "in_job", "attempts_left": 2, "max_restarts": 2},
    )


def test_restart_of_a_failed_group() -> None:
    # ft_launcher says FAILED instead of UNHEALTHY when every local rank had died by its poll
    # (common with gloo: a dead peer makes the others' next collective fail at once). It restarts
    # the group all the same, so this is a restart too.
    assert parse_line(FAILED_GROUP) == (
        "restart_begin",
        {"layer": "in_job", "attempts_left": 2, "max_restarts": 2},
    )


def test_restart_under_min_healthy() -> None:
    parsed = parse_line(MIN_HEALTHY_RESTART)
    assert parsed is not None and parsed[0] == "restart_begin"
    assert parsed[1]["attempts_left"] == 1 and parsed[1]["max_restarts"] == 1


def test_rendezvous_joined() -> None:
    assert parse_line(JOINED) == ("rendezvous_done", {"round": 1, "group_rank": 0, "nodes": 1})


# A 2-node job whose second node never came: NVRx 0.4.1, [rendezvous] join_timeout = "5s".
RENDEZVOUS_TIMED_OUT = (
    "[2026-12-01 14:41:57,243] [ERROR] [ft_launcher13764@vm] Agent run ended with exception, "
    "e=RendezvousTimeoutError(). Agent's exit code = 1"
)


def test_agent_error() -> None:
    parsed = parse_line(AGENT_ERROR)
    assert parsed is not None and parsed[0] == "launcher_error"
    assert parsed[1]["message"].startswith("e=RendezvousConnectionError('The connection to the C10d store")
    assert parsed[1]["error"] == "RendezvousConnectionError"


def test_rendezvous_timeout_is_told_apart() -> None:
    assert parse_line(RENDEZVOUS_TIMED_OUT) == (
        "launcher_error",
        {"message": "e=RendezvousTimeoutError()", "error": RENDEZVOUS_TIMEOUT},
    )


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ("e=RendezvousTimeoutError('waited 900s')", "RendezvousTimeoutError"),
        ("e=torch.distributed.DistStoreError('timeout')", "DistStoreError"),
        ("e=ValueError()", "ValueError"),
        ("something else entirely", None),
    ],
)
def test_agent_error_class(message: str, error: str | None) -> None:
    line = f"[x] [ERROR] [ft_launcher1@vm] Agent run ended with exception, {message}. Agent's exit code = 1"
    parsed = parse_line(line)
    assert parsed is not None and parsed[1].get("error") == error


HANG = (
    "[2026-11-29 10:23:51,003] [WARNING] [RankMonServer9210@vm:1] Did not get subsequent heartbeat. "
    "Waited 4.00 seconds."
)


def test_hang_detected_by_the_rank_monitor() -> None:
    # NVRx 0.4's monitor names the worker by its global rank (0.6/0.7: see test_nvrx_log_fixtures)
    assert parse_line(HANG) == ("hang_detected", {"rank": 1, "heartbeat": "subsequent"})
    initial = HANG.replace("subsequent", "initial").replace("vm:1", "vm:0")
    assert parse_line(initial) == ("hang_detected", {"rank": 0, "heartbeat": "initial"})


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (
            "[2026-12-02 21:10:01,203] [WARNING] [RankMonServer812@vm:1] Section 'step' has been open "
            "for 3.41 seconds. Timeout is 3.00 seconds.",
            {"rank": 1, "section": "step"},
        ),
        (
            "[2026-12-02 21:10:01,203] [WARNING] [RankMonServer812@vm:0] Was out of section for 31.02 "
            "seconds. Timeout is 30.00 seconds.",
            {"rank": 0, "section": "out-of-section"},
        ),
        (
            "2026-12-02 21:10:01,318 [WARNING] [vm] [workload:?(1) infra:?(?)] rank_monitor_server.py:523 "
            "[Cycle 0] Section 'checkpoint' has been open for 61.00 seconds. Timeout is 60.00 seconds.",
            {"local_rank": 1, "section": "checkpoint"},
        ),
    ],
)
def test_a_section_open_too_long_is_a_hang(line: str, fields: dict[str, object]) -> None:
    # NVRx's sections API: the monitor names the section instead of a heartbeat.
    assert parse_line(line) == ("hang_detected", fields)


@pytest.mark.parametrize("line", IGNORED)
def test_other_lines_are_ignored(line: str) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (-9, "SIGKILL"),
        (-15, "SIGTERM"),
        (-6, "SIGABRT"),
        (0, None),
        (1, None),
        (137, None),
        (-99, "signal 99"),
    ],
)
def test_signal_name(code: int, name: str | None) -> None:
    assert signal_name(code) == name


# -- the launcher's own lines (LogSorter) ------------------------------------------------------

_FIXTURES = Path(__file__).resolve().parent / "nvrx_logs"


@pytest.mark.parametrize("log", sorted(_FIXTURES.glob("*/*.log")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_launchers_lines_are_told_from_the_workers(log: Path) -> None:
    # Real ft_launcher logs of NVRx 0.4.1, 0.6.0 and 0.7.0 (both streams together: one sorter).
    sorter = LogSorter()
    hidden, shown_launcher, other = [], [], []
    for line in log.read_text(encoding="utf-8").splitlines(keepends=True):
        launchers, shown = sorter.sort(line)
        (other if not launchers else shown_launcher if shown else hidden).append(line)
    # every worker line stays, and nothing the launcher logs at INFO is shown
    assert all(not line.startswith("WORKER") for line in hidden + shown_launcher)
    assert any(line.startswith("WORKER") for line in other) or "rendezvous_timeout" in log.name
    warnings = {_message(line) for line in shown_launcher if re.search(r"\[WARNING\]|^W\d{4} ", line)}
    assert all(
        re.search(r"\[INFO\]|\[ALWAYS\]|^I\d{4} |^\s", line) or _message(line) in warnings for line in hidden
    ), hidden
    assert all(re.search(r"\[(WARNING|ERROR)\]|^[WE]\d{4} ", line) for line in shown_launcher)
    assert [line for line in hidden + other if re.search(r"\[ERROR\]|^E\d{4} ", line)] == []
    # the launch configuration's table goes with its record, and the agent's INFO lines too
    assert any("rdzv_endpoint    :" in line for line in hidden)
    assert not any(re.search(r"\[INFO\]|^\s+\w+\s*:", line) for line in other), other
    # a warning repeated word for word is shown once
    assert len(warnings) == len([line for line in shown_launcher if _message(line) in warnings])


def test_torchs_records_whatever_folder_names_their_file() -> None:
    # torch names its file relative to the first sys.path entry that holds it: the launcher's
    # working folder when the venv lies below it (NVRx 0.7.0, recorded: tests/nvrx/recorded/).
    sorter = LogSorter()
    line = (
        "W1208 01:36:18.652000 3990 .venv/lib/python3.11/site-packages/torch/distributed/elastic/"
        "multiprocessing/api.py:1028] Sending process 4000 closing signal SIGTERM\n"
    )
    assert sorter.sort(line) == (True, True)  # the launcher's warning, shown once
    assert sorter.sort(line) == (True, False)
    assert sorter.sort("WORKER start rank=0 pid=3975 restart=0 world=2\n") == (False, True)


def _message(line: str) -> str:
    """A log line without its date, level and logger (the pid of its writer)."""
    return re.sub(r"^.*?(\] |launcher\.py:\d+ |\.py:\d+\] )", "", line.split("] [", 3)[-1])


def test_a_workers_line_after_a_launcher_record_stays_the_workers() -> None:
    sorter = LogSorter()
    record = (
        "[2026-12-02 09:15:22,262] [INFO] [ft_launcher1@vm] Starting elastic_operator with launch configs:\n"
    )
    lines = [record, "  entrypoint       : train.py\n", "\n", "\n", '  File "x.py", line 1\n', "loss: 1.0\n"]
    assert [sorter.sort(line) for line in lines] == [
        (True, False),
        (True, False),
        (True, False),
        (False, True),  # a second blank line: the table ended at the first
        (False, True),  # not a table row (a worker's traceback)
        (False, True),
    ]
    assert sorter.sort(record) == (True, False)
    assert sorter.sort("loss: 1.0\n") == (False, True)  # not indented: not a row


# What NVRx 0.4.1's ft_launcher wrote, once per rank, as SIGTERM stopped a job whose workers use
# NVRx's in-process restart (tests/launcher/test_run_sigterm.py): asyncio's report of a rank
# monitor's connection handler that ft_launcher cancelled as it stopped.
_CALLBACK_AT = "at /root/.pyenv/versions/3.11.7/lib/python3.11/asyncio/streams.py:248"
_CANCELLED_TASK = "StreamReaderProtocol.connection_made.<locals>.callback(<Task cancell...erver.py:336>>)"
CANCELLED_CALLBACK = [
    f"[2026-12-04 20:58:14,951] [ERROR] [ft_launcher7137@vm] Exception in callback {_CANCELLED_TASK} "
    f"{_CALLBACK_AT}\n",
    f"handle: <Handle {_CANCELLED_TASK} {_CALLBACK_AT}>\n",
    "Traceback (most recent call last):\n",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/asyncio/events.py", line 80, in _run\n',
    "    self._context.run(self._callback, *self._args)\n",
    '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/asyncio/streams.py", line 249, in callback\n',
    "    exc = task.exception()\n",
    "          ^^^^^^^^^^^^^^^^\n",
    '  File "/venv/lib/python3.11/site-packages/nvidia_resiliency_ext/fault_tolerance/utils.py", line '
    "127, in read_obj_from_ipc_stream\n",
    "    obj_size_as_bytes = await stream.readexactly(4)\n",
    "                        ^^^^^^^^^^^^^^^^^^^^^^^^^^^\n",
    "asyncio.exceptions.CancelledError\n",
]


def test_a_cancelled_rank_monitor_connection_is_not_shown() -> None:
    sorter = LogSorter()
    lines = CANCELLED_CALLBACK * 2 + ["WORKER HEARTBEAT rank=0 step=3\n"]
    # the record and its whole traceback are the launcher's (its log keeps them), none is shown
    assert [sorter.sort(line) for line in lines] == [(True, False)] * 24 + [(False, True)]


def test_a_launcher_error_shows_its_traceback_and_the_exceptions_chained_to_it() -> None:
    sorter = LogSorter()
    lines = [
        "[2026-12-04 20:58:14,951] [ERROR] [ft_launcher7137@vm] Unexpected error in the agent\n",
        "Traceback (most recent call last):\n",
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 8, in run\n',
        "    agent.run()\n",
        "KeyError: 'x'\n",
        "\n",
        "During handling of the above exception, another exception occurred:\n",
        "\n",
        "Traceback (most recent call last):\n",
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 9, in run\n',
        "RuntimeError: the store went away\n",
    ]
    assert [sorter.sort(line) for line in lines] == [(True, True)] * len(lines)
    # what follows the exception's line is a worker's again, shown: a traceback of its own
    # (not after a record) and its exception too
    after = ["WORKER START rank=1\n", "Traceback (most recent call last):\n", "ValueError: x\n"]
    assert [sorter.sort(line) for line in after] == [(False, True)] * 3


def test_a_cancelled_task_is_hidden_only_in_asyncios_callback_report() -> None:
    sorter = LogSorter()
    # an INFO record followed by a traceback: the launcher's, hidden like the record
    info = "[2026-12-04 20:58:14,951] [INFO] [ft_launcher1@vm] Retrying <Task cancelled>\n"
    assert sorter.sort(info) == (True, False)
    assert sorter.sort("Traceback (most recent call last):\n") == (True, False)
    # asyncio's report of a callback whose task failed (not cancelled) is an error: shown
    failed = CANCELLED_CALLBACK[0].replace("<Task cancell...", "<Task finishe...")
    assert sorter.sort(failed) == (True, True)
    assert sorter.sort(CANCELLED_CALLBACK[1].replace("<Task cancell...", "<Task finishe...")) == (True, True)
    assert sorter.sort("Traceback (most recent call last):\n") == (True, True)
    # a traceback's line that does not come right after a record is not the launcher's
    sorter = LogSorter()
    assert sorter.sort(CANCELLED_CALLBACK[0]) == (True, False)
    assert sorter.sort("WORKER START rank=1\n") == (False, True)
    assert sorter.sort("Traceback (most recent call last):\n") == (False, True)


@pytest.mark.parametrize(
    ("line", "raised"),
    [
        ("[rank1]: Traceback (most recent call last):\n", Raised(1, None)),
        ('[rank1]:   File "/job/train.py", line 7, in <module>\n', Raised(1, None)),
        ("[rank12]: RuntimeError: boom at step 3\n", Raised(12, "RuntimeError: boom at step 3")),
        (
            "[rank0]: torch.distributed.DistBackendError: NCCL error\n",
            Raised(0, "torch.distributed.DistBackendError: NCCL error"),
        ),
        ("[rank0]: KeyboardInterrupt\n", Raised(0, "KeyboardInterrupt")),
        ("[rank0]: During handling of the above exception, another exception occurred:\n", Raised(0, None)),
        ("RuntimeError: boom\n", None),
    ],
)
def test_read_raised(line: str, raised: Raised | None) -> None:
    assert read_raised(line) == raised


def test_caused_by_peer() -> None:
    assert caused_by_peer(
        "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:1"
    )
    assert caused_by_peer("torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1.")
    assert not caused_by_peer("RuntimeError: boom at step 3")

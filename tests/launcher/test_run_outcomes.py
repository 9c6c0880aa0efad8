"""How ``nvtrain run`` ends and what it leaves for Kubernetes, under the real ft_launcher (NVRx
0.4.1 on CPU): exit 3 for a rendezvous that never completes, the root cause in the termination
log, the plain event lines of pod logs, and escalation that sees progress in plain scripts.

The rendezvous test runs node 0 of a 2-node job alone on this machine. Pod 0's stable DNS name
must resolve for that: the run gets its own ``/etc/hosts`` (a private mount namespace, see
``with_hosts``), with pod 0's name on 127.0.0.1, and no POD_IP, so the node also publishes that
name as its own address.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.proc_helpers import BIN, NvtrainRunner, Running, make_policy, read_events, with_hosts

pytestmark = pytest.mark.slow

POD0 = "proc-test-0.proc-test.default.svc.cluster.local"


def events_of(tmp_path: Path, run_id: str) -> list[dict[str, Any]]:
    return read_events(tmp_path / "ckpt" / run_id)


def test_rendezvous_not_completed_in_time_exits_3(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    policy, tables = make_policy(
        tmp_path,
        script=str(BIN / "noop_worker.py"),
        nproc=1,
        rendezvous={"nodes": 2, "join_timeout": "5s", "dns_timeout": "10s"},
    )
    endpoint = f"{POD0}:{tables['rendezvous']['port']}"
    termination_log = tmp_path / "termination-log"
    started = time.monotonic()
    run = nvtrain.start(
        str(policy),
        env={
            "JOB_COMPLETION_INDEX": "0",
            "NVTRAIN_RUN_ID": "rdzv-1",
            "NVTRAIN_TERMINATION_LOG": str(termination_log),
        },
        prefix=with_hosts(tmp_path, [POD0]),
    )
    code = run.wait(timeout=90)
    took = time.monotonic() - started
    assert code == 3, run.describe()
    assert took < 45, f"took {took:.1f}s with join_timeout = 5s\n{run.describe()}"
    assert run.launcher_seen(), run.describe()  # ft_launcher did start and wait for the other node
    assert "WORKER RAN" not in run.stdout
    err = run.stderr
    assert "Traceback" not in err, run.describe()
    for text in (
        "rendezvous not completed in time on pod",
        f"the rendezvous at {endpoint} (run id rdzv-1) needs 2 node(s)",
        "[rendezvous] join_timeout = 5s",
        "this node joined",
        "not scheduled",
        "NetworkPolicy",
        f"TCP port {tables['rendezvous']['port']}",
    ):
        assert text in err, f"{text!r} missing\n{run.describe()}"

    events = events_of(tmp_path, "rdzv-1")
    assert f"--local-addr={POD0}" in events[0]["argv"]  # no POD_IP: the pod's own stable name
    errors = [e for e in events if e["event"] == "launcher_error"]
    assert [e["error"] for e in errors] == ["RendezvousTimeoutError"], events
    assert not [e for e in events if e["event"] == "relaunch"]  # pod 0 hosts the store: no relaunch
    assert events[-1]["event"] == "launcher_exit" and events[-1]["exit_code"] == 3
    assert termination_log.read_text(encoding="utf-8") == events[-1]["cause"] + "\n"


# -- one failing run, two things checked on it ---------------------------------------------------


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Path, Path]]:
    """A run whose rank 1 exits 3 with no restarts left: exit 1. NVTRAIN_TERMINATION_LOG names
    a file that does not exist yet (Kubernetes' terminationMessagePath moved elsewhere)."""
    tmp_path = tmp_path_factory.mktemp("failed")
    runner = NvtrainRunner(tmp_path)
    try:
        policy, _ = make_policy(
            tmp_path,
            script=str(BIN / "fail_worker.py"),
            args=["--code", "3"],
            max_restarts=0,
            escalate_after=10,
        )
        termination_log = tmp_path / "termination-log"
        run = runner.start(
            "--run-id", "failed-1", str(policy), env={"NVTRAIN_TERMINATION_LOG": str(termination_log)}
        )
        assert run.wait(timeout=90) == 1, run.describe()
        yield run, termination_log, tmp_path
    finally:
        runner.close()


def test_termination_log_holds_the_root_cause(failed_run: tuple[Running, Path, Path]) -> None:
    run, termination_log, tmp_path = failed_run
    assert termination_log.is_file(), run.describe()
    text = termination_log.read_text(encoding="utf-8")
    assert text.endswith("\n") and text.count("\n") == 1, text  # one paragraph
    assert "Root cause (first failure): local rank 1" in text, text
    assert "exit code 3" in text and "0/0 in-job restarts used" in text, text
    events = events_of(tmp_path, "failed-1")
    assert events[-1]["event"] == "launcher_exit" and events[-1]["exit_code"] == 1
    assert text == events[-1]["cause"] + "\n"


# "nvtrain: HH:MM:SS event=NAME key=value ...": a value is a JSON string when it has spaces or
# quotes (or is empty), else a bare token (numbers, true/false, [..] JSON without spaces...).
_PLAIN = re.compile(
    r"nvtrain: (\d\d):(\d\d):(\d\d) event=([a-z_]+)((?: [a-z_]+=(?:\"(?:[^\"\\]|\\.)*\"|\S+))*)"
)
_PAIR = re.compile(r" ([a-z_]+)=(\"(?:[^\"\\]|\\.)*\"|\S+)")


def test_pod_log_event_lines_are_plain_and_structured(failed_run: tuple[Running, Path, Path]) -> None:
    run, _, tmp_path = failed_run
    lines = [line for line in run.stderr.splitlines() if line.startswith("nvtrain")]
    assert lines, run.describe()
    names = []
    fields: dict[str, dict[str, str]] = {}
    for line in lines:
        match = _PLAIN.fullmatch(line)
        assert match, f"not a plain event line: {line!r}"
        hours, minutes, secs = (int(g) for g in match.group(1, 2, 3))
        assert hours < 24 and minutes < 60 and secs < 60, line
        names.append(match.group(4))
        fields[match.group(4)] = dict(_PAIR.findall(match.group(5)))
    assert names[0] == "launcher_start" and names[-1] == "launcher_exit", names
    assert "worker_failed" in names and "rendezvous_done" in names, names
    assert "\x1b[" not in run.stderr  # no terminal styling in pod logs
    failed = fields["worker_failed"]
    assert (failed["local_rank"], failed["exit_code"], failed["signal"]) == ("1", "3", "null"), failed
    end = fields["launcher_exit"]
    assert end["exit_code"] == "1"
    assert json.loads(end["cause"]) == events_of(tmp_path, "failed-1")[-1]["cause"]
    assert "argv" not in fields["launcher_start"]  # the command line stays in the events log


# -- escalation sees progress in a script that reports no steps ----------------------------------


def test_plain_script_failing_after_progress_is_not_escalated(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    # benchmarks/recovery/RESULTS.md: a torchrun-style script (no step events) that failed three
    # times with steps made in between was stopped with exit 4 at its escalate_after-th failure;
    # torchrun finished the same job. Here rank 1 works 7 s, longer than [heartbeat]
    # initial_timeout (5 s), then fails, on two attempts in a row (escalate_after = 2); the third
    # attempt finishes. Both failed attempts made progress, so nothing escalates.
    policy, _ = make_policy(
        tmp_path,
        script=str(BIN / "fail_worker.py"),
        args=["--code", "3", "--after", "7", "--fail-until", "2"],
        max_restarts=3,
        escalate_after=2,
        heartbeat={"initial_timeout": "5s"},
    )
    run = nvtrain.start("--run-id", "progress-1", str(policy))
    code = run.wait(timeout=120)
    assert code == 0, run.describe()
    assert [int(n) for n in re.findall(r"WORKER FAIL rank=1 restart=(\d+)", run.stdout)] == [0, 1]
    assert "WORKER DONE rank=1 restart=2" in run.stdout, run.describe()
    events = events_of(tmp_path, "progress-1")
    failed = [e for e in events if e["event"] == "worker_failed"]
    assert [(f["local_rank"], f["exit_code"]) for f in failed] == [(1, 3), (1, 3)], events
    assert events[-1]["event"] == "launcher_exit" and events[-1]["exit_code"] == 0

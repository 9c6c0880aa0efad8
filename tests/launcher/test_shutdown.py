"""How ``nvtrain run`` ends once training is over (issue 37): the last save is committed first,
then everything the run started has ended, then ``launcher_exit`` is logged and the process exits
0, with nothing left running and nothing that had to be killed.

The end-to-end runs are the demo job (2 gloo ranks, FSDP2, in-process restart on, an async save
in flight when the last step ends), cold and warm. The seam test runs the supervisor with
stand-ins for ft_launcher and the warm-start server (real processes): the server must be gone
before the sweep of leftovers starts, which would give it SIGTERM and wait for it. How long the
end takes is measured by ``benchmarks/shutdown.py`` (BENCHMARKS.md), not here.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from nvtrain.config.schema import Policy
from nvtrain.events import EventLog
from nvtrain.launcher.identity import identify
from nvtrain.launcher.plan import LaunchPlan
from nvtrain.launcher.process import Child
from nvtrain.launcher.supervisor import Launcher, Supervisor
from support.proc_helpers import (
    NvtrainRunner,
    alive,
    make_policy,
    processes_with_token,
    read_events,
    write_policy,
)

pytestmark = pytest.mark.slow

STEPS, INTERVAL = 12, 4


def _demo_policy(tmp_path: Path, *, warm: bool) -> Path:
    _, tables = make_policy(
        tmp_path,
        module="nvtrain.demo",
        args=["--steps", str(STEPS), "--step-time", "0", "--log-every", str(INTERVAL)],
        nproc=2,
        stop_timeout="10s",
        heartbeat={"initial_timeout": "90s", "timeout": "12s", "monitor_interval": "1s"},
        warm_start=warm,
    )
    tables["job"].update({"max_steps": STEPS, "backend": "gloo", "collective_timeout": "4s"})
    tables["restart.in_process"] = {"enabled": True, "soft_timeout": "5s", "hard_timeout": "10s"}
    tables["checkpoint"].update({"interval": INTERVAL, "async": True, "keep": 2})
    return write_policy(tmp_path, tables)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_finished_run_commits_its_last_save_then_exits_with_nothing_left(
    nvtrain: NvtrainRunner, tmp_path: Path, warm: bool
) -> None:
    run = nvtrain.start("--run-id", "end-1", str(_demo_policy(tmp_path, warm=warm)))
    code = run.wait(timeout=180)
    # Nothing of the run outlives ``nvtrain run``: checked the moment it has exited, not after.
    left = [f"{p.pid} {' '.join(p.cmdline())}" for p in processes_with_token(run.token)]
    assert code == 0, run.describe()
    assert left == [], "\n".join(left)
    assert not [key for key in run.seen if alive(*key)], run.seen
    assert len(run.seen) >= 3, run.seen  # ft_launcher and two workers (and more) were seen

    run_dir = tmp_path / "ckpt" / "end-1"
    events = read_events(run_dir)
    names = [e["event"] for e in events]
    assert names[-1] == "launcher_exit" and events[-1]["exit_code"] == 0, names[-5:]
    assert "killed_leftovers" not in names, events  # everything ended by itself or was stopped
    # The save in flight when the last step ended was waited for: committed, before the exit.
    steps = [i for i, e in enumerate(events) if e["event"] == "step" and e["step"] == STEPS]
    commits = [i for i, e in enumerate(events) if e["event"] == "checkpoint_committed" and e["step"] == STEPS]
    assert steps and commits and steps[0] < commits[0] < len(events) - 1, names
    assert (run_dir / f"step-{STEPS:06d}" / "COMMITTED").is_file()
    assert run.stdout.count("finished fingerprint") == 2, run.describe()


# -- the warm-start server, stopped before the sweep ---------------------------------------------

_STUBBORN = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.pause()"
"""The server's stand-in ignores SIGTERM: the sweep would have to wait for its deadline."""


class _StandIns(Supervisor):
    """The real supervisor loop with real processes standing in for ft_launcher (ends at once)
    and the warm-start server; the sweep only notes what still runs (a test process must not
    stop its other children)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.children: list[Child] = []
        self.running_at_sweep: list[int] = []

    def start_launcher(self) -> Launcher:
        child = super().start_launcher()
        assert isinstance(child, Child)
        self.children.append(child)
        return child

    def start_zygote(self) -> Child | None:
        child = super().start_zygote()
        assert child is not None
        self.children.append(child)
        return child

    def kill_leftovers(self) -> list[int]:
        self.running_at_sweep = [c.pid for c in self.children if c.popen.poll() is None]
        return []

    def close(self) -> None:
        for child in self.children:
            if child.popen.poll() is None:  # left running (the test failed): stopped here
                child.popen.kill()
            child.wait()
            for stream in (child.popen.stdout, child.popen.stderr):
                if stream is not None:
                    stream.close()
            if child.guard is not None:
                child.guard.wait(timeout=30)


def test_the_warm_start_server_is_gone_before_the_sweep_of_leftovers(tmp_path: Path) -> None:
    policy = Policy.model_validate({"job": {"name": "t", "script": "train.py"}})
    identity = identify(policy, {"NVTRAIN_RUN_ID": "run-1"}, hostname="t-0")
    plan = LaunchPlan(
        argv=[sys.executable, "-c", "print('LAUNCHER DONE')"],
        env={},
        endpoint="127.0.0.1:29500",
        is_host=True,
        wait_for=None,
        stop_timeout=5.0,
        zygote=[sys.executable, "-c", _STUBBORN],
    )
    events = EventLog(tmp_path / "events.jsonl", node=0, run_id="run-1", source="launcher")
    out = (tmp_path / "echo.txt").open("w", encoding="utf-8")
    supervisor = _StandIns(plan, policy, identity, events, env=os.environ, report=lambda _: None, out=out)
    try:
        outcome = supervisor.run()
    finally:
        supervisor.close()
        out.close()
    assert outcome.exit_code == 0
    assert supervisor.running_at_sweep == []
    launcher, zygote = supervisor.children[1], supervisor.children[0]
    assert launcher.popen.returncode == 0
    assert zygote.popen.returncode == -signal.SIGKILL
    assert (tmp_path / "echo.txt").read_text(encoding="utf-8") == "LAUNCHER DONE\n"

"""Smaller drop-in gaps of ``nvtrain run``, each with a real run (NVRx 0.4.1's ft_launcher):
the script's ``__file__`` is absolute, as under ``python`` and torchrun; ``--policy FILE
train.py`` with a FILE of settings only (no ``[job] script``) and a relative ``[checkpoint]
dir``, resolved where ``nvtrain run`` started; off a pod, a policy without ``[checkpoint] dir``
keeps its checkpoints in the run's folder under ``$TMPDIR``; the state folder of an ``nvtrain
run`` killed with SIGKILL is removed by the next start; a busy port given by ``--master-port``
is named by that flag.

The command lines (``--dry-run``): tests/cli/test_run_off_kubernetes.py.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from support.proc_helpers import BIN, NvtrainRunner, processes_with_token, read_events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

WHERE = """\
import os, sys
print(f"WHERE file={__file__} argv0={sys.argv[0]} cwd={os.getcwd()}", flush=True)
"""

WAIT = """\
import sys, time
print("WAITING", flush=True)
time.sleep(120)
"""


def test_file_is_absolute_and_a_settings_policy_with_a_relative_checkpoint_dir(
    nvtrain: NvtrainRunner, tmp_path: Path
) -> None:
    (tmp_path / "where.py").write_text(WHERE, encoding="utf-8")
    settings = tmp_path / "settings.toml"
    settings.write_text('[job]\nname = "low"\n[checkpoint]\ndir = "ckpt"\n', encoding="utf-8")
    run = nvtrain.start("--run-id", "low-1", "--policy", "settings.toml", "where.py")  # cwd: tmp_path
    assert run.wait(timeout=180) == 0, run.describe()
    assert f"WHERE file={tmp_path / 'where.py'} " in run.stdout, run.describe()
    assert f"cwd={tmp_path}" in run.stdout, run.describe()
    events = read_events(tmp_path / "ckpt" / "low-1")  # [checkpoint] dir = "ckpt", resolved
    assert [e["exit_code"] for e in events if e["event"] == "launcher_exit"] == [0], events


def test_off_a_pod_the_default_checkpoints_go_to_the_run_folder(
    nvtrain: NvtrainRunner, tmp_path: Path
) -> None:
    """A policy without ``[checkpoint] dir``, off a pod: the run's folder is
    ``$TMPDIR/nvtrain/<run id>/``, and the worker library's checkpoints are in it, beside the
    events log, not in ``/checkpoints`` at the filesystem's root."""
    policy = tmp_path / "mini.toml"
    policy.write_text(
        '[job]\nname = "mini"\nmodule = "nvtrain.demo"\nbackend = "gloo"\n'
        'args = ["--steps", "4", "--step-time", "0", "--log-every", "4"]\n[checkpoint]\ninterval = 2\n',
        encoding="utf-8",
    )
    run = nvtrain.start("--run-id", "mini-1", str(policy))
    assert run.wait(timeout=120) == 0, run.describe()
    run_dir = nvtrain.tmpdir.resolve() / "nvtrain" / "mini-1"
    found = sorted(p.name for p in run_dir.iterdir())
    assert found == ["events-node0.jsonl", "launcher-node0.log", "step-000002", "step-000004"], found
    assert (run_dir / "step-000004" / "COMMITTED").is_file()
    events = read_events(run_dir)
    assert [e["step"] for e in events if e["event"] == "checkpoint_committed"] == [2, 4], events


def _state_folders(tmpdir: Path) -> list[Path]:
    return sorted(p for p in tmpdir.iterdir() if p.name.startswith("nvtrain-"))


def test_the_state_folder_of_a_killed_run_goes_with_the_next_start(
    nvtrain: NvtrainRunner, tmp_path: Path
) -> None:
    waiter = tmp_path / "wait.py"
    waiter.write_text(WAIT, encoding="utf-8")
    killed = nvtrain.start("--run-id", "killed-1", "--no-warm-start", str(waiter))
    killed.wait_for_stdout("WAITING", timeout=120)
    # nvtrain-<run id>-node0-<pid>-<random part>: a name nobody else can take first
    states = [
        p
        for p in _state_folders(nvtrain.tmpdir)
        if p.name.startswith(f"nvtrain-killed-1-node0-{killed.pid}-")
    ]
    assert len(states) == 1 and states[0].is_dir(), _state_folders(nvtrain.tmpdir)
    state = states[0]
    os.kill(killed.pid, signal.SIGKILL)  # no finally runs: nothing removes the state folder
    assert killed.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 60  # its guard stops what it started
    while processes_with_token(killed.token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_with_token(killed.token)
    assert state.is_dir()
    later = nvtrain.start("--run-id", "later-1", "--no-warm-start", str(BIN / "noop_worker.py"))
    assert later.wait(timeout=180) == 0, later.describe()
    assert _state_folders(nvtrain.tmpdir) == [], _state_folders(nvtrain.tmpdir)


def test_a_busy_master_port_is_named_by_the_flag(nvtrain: NvtrainRunner) -> None:
    with socket.create_server(("0.0.0.0", 0)) as server:
        port = int(server.getsockname()[1])
        run = nvtrain.start("--master-port", str(port), str(BIN / "noop_worker.py"))
        assert run.wait(timeout=60) == 2, run.describe()
    assert f"--master-port {port}: [rendezvous] port = {port} is in use" in run.stderr, run.describe()
    assert "pass another free port (--master-port)" in run.stderr, run.describe()
    assert not run.launcher_seen(), run.describe()

"""``nvtrain.nvrx.ftmain``: ft_launcher with its fixed waits shortened.

Real child processes and process groups; the NVRx 0.4.1 of CI for what ``tune`` changes there.
The changes for NVRx 0.6 and later are checked where such an NVRx is installed (the GPU image;
``benchmarks/recovery/nvrx_versions.sh``) and measured in BENCHMARKS.md.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
import types

import pytest

from nvtrain.nvrx import NvrxVersion, ftmain, installed_nvrx

_EXIT_ON_LINE = "import sys; sys.stdin.readline()"


def _child(code: str, **kwargs: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, **kwargs)  # type: ignore[call-overload]


def _end(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


# Importing NVRx's launcher imports torch, whose pynvml shim warns (see tests/conftest.py).
PYNVML = pytest.mark.filterwarnings("ignore:The pynvml package is deprecated:FutureWarning")


def test_options_are_read_as_ft_launcher_reads_them() -> None:
    argv = ["--nnodes=1:1", "--monitor-interval", "0.1", "-m", "x"]
    assert ftmain.monitor_interval(argv) == 0.1
    assert ftmain.monitor_interval(["--monitor_interval=2"]) == 2.0
    assert ftmain.monitor_interval(["--monitor-interval=soon"]) is None
    assert ftmain.one_node(argv) and ftmain.one_node(["--nnodes", "1"])
    assert not ftmain.one_node(["--nnodes=1:2"]) and not ftmain.one_node([])


def test_a_wait_ends_when_a_child_exits() -> None:
    exits = ftmain.ChildExits()
    child = _child(_EXIT_ON_LINE)
    try:
        assert exits.wait(0) is False  # running
        assert child.stdin is not None
        child.stdin.write(b"\n")
        child.stdin.flush()
        # Without the exit seen, this returns False after the full minute (and the test fails).
        assert exits.wait(60) is True
        # Seen once and not yet reaped: the same exit does not end the next wait.
        assert exits.wait(0.05) is False
    finally:
        _end(child)
    exits.wait(0)  # reaped: its pidfd is closed
    assert child.pid not in exits.fds


def test_the_cleanup_kills_what_ignores_sigterm_and_spares_other_groups() -> None:
    stubborn = _child(
        "import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); sys.stdin.readline()",
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    polite = _child(_EXIT_ON_LINE, start_new_session=True)
    bystander = _child(_EXIT_ON_LINE, start_new_session=True)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"up\n"
        ftmain.prompt_group_cleanup({stubborn.pid, polite.pid})
        assert stubborn.wait(10) == -signal.SIGKILL
        assert polite.wait(10) == -signal.SIGTERM
        assert bystander.poll() is None
        ftmain.prompt_group_cleanup({1, bystander.pid})  # NVRx's own guard: nothing is signalled
        assert bystander.poll() is None
    finally:
        _end(stubborn, polite, bystander)


@PYNVML
def test_tune_wraps_only_the_monitor_sleep_of_the_installed_nvrx() -> None:
    launcher = importlib.import_module(ftmain.LAUNCHER)
    version = installed_nvrx()
    saved = launcher.time
    try:
        done = ftmain.tune(launcher, version, ["--nnodes=1:1", "--monitor-interval=0.1"])
        assert done[0] == "monitor loop woken by child exits"
        clock = launcher.time
        assert isinstance(clock, types.ModuleType) and clock is not saved
        assert clock.monotonic is time.monotonic  # everything else is the real module's
        started = time.monotonic()
        clock.sleep(0.05)  # not the monitor interval: a plain sleep
        assert time.monotonic() - started >= 0.05
        if version is not None and not version.barrier_rendezvous:
            assert done == ["monitor loop woken by child exits"]  # 0.4: nothing else to change
    finally:
        launcher.time = saved


def test_no_interval_no_change() -> None:
    module = types.ModuleType("fake_launcher")
    module.time = time  # type: ignore[attr-defined]
    assert ftmain.tune(module, NvrxVersion(0, 4, 1), ["--nnodes=1:1"]) == []
    assert module.time is time  # type: ignore[attr-defined]


@PYNVML
@pytest.mark.skipif(
    installed_nvrx() is None or not installed_nvrx().barrier_rendezvous,  # type: ignore[union-attr]
    reason="NVRx 0.6 or later (its barrier rendezvous) is not installed here",
)
def test_nvrx_0_6_and_later_get_every_change() -> None:
    launcher = importlib.import_module(ftmain.LAUNCHER)
    saved_time, saved_cleanup = launcher.time, launcher.terminate_mp_processes
    barrier = importlib.import_module(ftmain.BARRIER)
    saved_wait = barrier._RendezvousBarrierState._wait_for_rendezvous_open
    try:
        done = ftmain.tune(launcher, installed_nvrx(), ["--nnodes=1:1", "--monitor-interval=0.1"])
        assert len(done) == 4, done
        assert launcher.terminate_mp_processes is ftmain.prompt_group_cleanup
    finally:
        launcher.time, launcher.terminate_mp_processes = saved_time, saved_cleanup
        barrier._RendezvousBarrierState._wait_for_rendezvous_open = saved_wait


def test_ftmain_refuses_another_module_name() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nvtrain.nvrx.ftmain", "os", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 1 and "usage: python -m nvtrain.nvrx.ftmain" in done.stderr

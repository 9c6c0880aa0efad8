"""``nvtrain.launcher.process`` with tiny shell children: stop timing, exit status, no orphans.

``Child.stop`` ends with ``kill_all``, which signals every descendant of the calling process:
the test process's own, so the warm-start server an earlier test of this process started
(``warm_server``) ends too; ``WarmServer.client`` starts it again when a later test needs it.
The subreaper part runs in a helper subprocess so that the test process never becomes a
subreaper itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from nvtrain.launcher.process import Child, descendants
from support.waiting import wait_until

pytestmark = pytest.mark.slow


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_stop_a_child_that_obeys_sigterm() -> None:
    child = Child(["sleep", "60"], os.environ, capture=False)
    try:
        started = time.monotonic()
        code = child.stop(time.monotonic() + 10.0)
        took = time.monotonic() - started
    finally:
        child.popen.kill()
        child.popen.wait()
    assert code == -signal.SIGTERM
    assert took < 1.5, f"{took:.2f}s"


def test_stop_a_child_that_ignores_sigterm_kills_at_the_deadline() -> None:
    deadline_s = 2.0
    child = Child(["sh", "-c", "trap '' TERM; sleep 60"], os.environ, capture=False)
    try:
        # Until the shell has started its sleep.
        sleeper = wait_until(lambda: descendants(child.pid), 30, "the shell's sleep")[0]
        started = time.monotonic()
        code = child.stop(started + deadline_s)
        took = time.monotonic() - started
    finally:
        with_pgid_killed(child)
    assert code == -signal.SIGKILL
    assert deadline_s <= took < deadline_s + 3.0, f"{took:.2f}s"
    # the grandchild in the child's process group is gone too
    assert psutil.wait_procs([sleeper], timeout=2.0)[1] == [] or _gone(sleeper.pid)


def with_pgid_killed(child: Child) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.popen.wait()


def test_stop_an_exited_child_returns_its_code() -> None:
    child = Child(["sh", "-c", "exit 3"], os.environ, capture=False)
    child.wait(5)
    assert child.stop(time.monotonic() + 5) == 3


def test_captured_output_keeps_stdout_and_stderr_apart() -> None:
    child = Child(["sh", "-c", "echo HELLO; echo ERR >&2; echo BYE"], os.environ, capture=True)
    assert child.popen.stdout is not None and child.popen.stderr is not None
    with child.popen.stdout, child.popen.stderr:
        out, err = list(child.stdout_lines()), list(child.stderr_lines())
    assert child.wait(5) == 0
    assert (out, err) == (["HELLO\n", "BYE\n"], ["ERR\n"])


# Runs in its own interpreter: becomes a subreaper, starts a child whose grandchild leaves the
# child's session (setsid) and is orphaned, then cleans up with kill_all / Child.stop.
_HELPER = textwrap.dedent(
    r"""
    import json, os, time, subprocess
    import psutil
    from nvtrain.launcher.process import Child, become_subreaper, kill_all

    result = {"me": os.getpid(), "subreaper": become_subreaper()}

    # 1. the child exits at once; its grandchild (own session, ignores SIGTERM) is orphaned
    out = subprocess.run(
        ["sh", "-c", "setsid sh -c 'trap \"\" TERM; exec sleep 60' > /dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )
    orphan = int(out.stdout.strip())
    # Until the orphan has its own session and has exec'd its sleep (SIGTERM ignored by then).
    deadline = time.monotonic() + 30
    while not (os.getsid(orphan) == orphan and psutil.Process(orphan).name() == "sleep"):
        assert time.monotonic() < deadline, "the orphan never became a sleep in its own session"
        time.sleep(0.01)
    result["orphan"] = orphan
    result["orphan_parent"] = psutil.Process(orphan).ppid()
    t0 = time.monotonic()
    result["killed"] = kill_all(timeout=2.0)
    result["kill_all_s"] = time.monotonic() - t0
    result["orphan_alive"] = psutil.pid_exists(orphan) and (
        psutil.Process(orphan).status() != psutil.STATUS_ZOMBIE
    )

    # 2. Child.stop on a shell that started a detached grandchild and waits
    child = Child(["sh", "-c", "setsid sleep 60 & echo $!; wait"], os.environ, capture=True)
    detached = int(child.popen.stdout.readline())
    # Until the grandchild has left the shell's process group (setsid done).
    deadline = time.monotonic() + 30
    while os.getsid(detached) != detached:
        assert time.monotonic() < deadline, "the grandchild never got a session of its own"
        time.sleep(0.01)
    result["detached"] = detached
    result["stop_code"] = child.stop(time.monotonic() + 3.0)
    result["detached_alive"] = psutil.pid_exists(detached) and (
        psutil.Process(detached).status() != psutil.STATUS_ZOMBIE
    )
    print(json.dumps(result))
    """
)


def test_orphans_in_their_own_session_are_killed_by_a_subreaper() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _HELPER], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    leftovers = [pid for pid in (result["orphan"], result["detached"]) if not _gone(pid)]
    for pid in leftovers:  # never leave a sleep behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert result["subreaper"] is True
    # re-parented to the subreaper, not to init: that is how kill_all can find it
    assert result["orphan_parent"] == result["me"]
    # it ignores SIGTERM: KILLed once kill_all's 2 s are up
    assert result["killed"] == [result["orphan"]]
    assert result["orphan_alive"] is False
    assert 2.0 <= result["kill_all_s"] < 5.0
    assert result["stop_code"] == -signal.SIGTERM
    assert result["detached_alive"] is False
    assert leftovers == []

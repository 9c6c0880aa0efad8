"""``Child.stop_frozen``, the stop that escalation uses, on real processes: a launcher that ignores
SIGTERM and keeps starting workers is frozen, starts none after, and its whole tree ends by the
deadline: a stopped worker at once (SIGKILL: it cannot act on SIGTERM), one that ignores SIGTERM
at the deadline, the launcher last. Run in a driver process of its own, a child subreaper as
``nvtrain run`` is, so that nothing of the test runner's is touched."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import psutil
import pytest

from support.proc_helpers import BIN

pytestmark = pytest.mark.slow

DRIVER = textwrap.dedent(
    """
    import json, re, sys, time
    import psutil
    from nvtrain.launcher.process import Child, become_subreaper, descendants

    become_subreaper()
    launcher = Child([sys.executable, sys.argv[1]], {}, capture=True, guard=10.0)
    lines = launcher.stdout_lines()
    rounds, workers = [], set()
    for line in lines:  # the workers write to the launcher's stdout too
        if line.startswith("ROUND"):
            rounds.append(int(re.search(r"pid=(\\d+)", line).group(1)))
        if line.startswith("WORKER"):
            workers.add(int(line.split()[1]))
        if len(rounds) >= 3 and {0, 1, 2} <= workers:
            break
    # Worker 0 ignores SIGTERM (it printed after that), worker 2 sleeps; worker 1 stops itself
    # right after its line: until it is stopped.
    deadline = time.monotonic() + 30
    while psutil.Process(rounds[1]).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "worker 1 never stopped itself"
        time.sleep(0.01)
    tree = [p.pid for p in descendants() if p.pid != launcher.guard.pid]
    started = time.monotonic()
    code = launcher.stop_frozen(started + 3.0)
    took = time.monotonic() - started
    printed = [int(re.search(r"pid=(\\d+)", line).group(1)) for line in lines if line.startswith("ROUND")]
    later = [pid for pid in printed if pid not in tree]  # started after the look at the tree
    left = [p.pid for p in descendants() if p.pid != launcher.guard.pid and p.status() != "zombie"]
    print(json.dumps({"code": code, "took": took, "rounds": rounds, "tree": tree,
                      "later": later, "left": left}))
    """
)


def test_a_frozen_launcher_starts_nothing_more_and_its_tree_ends_by_the_deadline() -> None:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(BIN / "round_launcher.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["code"] == -9, result  # the launcher is killed last, frozen to the end
    # At most the round it was starting as it froze (after the look at its tree): never two.
    assert len(result["later"]) <= 1, result
    assert result["left"] == [], result
    # Worker 0 ignores SIGTERM: the stop lasts until the deadline (3 s), not longer.
    assert 2.5 <= result["took"] < 6.0, result
    for pid in result["tree"]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


KILLED_LATE = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from nvtrain.launcher.process import descendants, stop_descendants

    # A descendant that ignores SIGTERM and holds 1 GiB it has written to: its exit after the
    # SIGKILL (the kernel freeing those pages) takes a while, not an instant.
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "READY"
    killed = stop_descendants(time.monotonic())  # the deadline is now: SIGKILL at once
    left = [p.pid for p in descendants() if p.status() != "zombie"]
    print(json.dumps({"child": child.pid, "killed": killed, "left": left}))
    """
)
BIG = textwrap.dedent(
    """
    import mmap, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    memory = mmap.mmap(-1, 1 << 30)
    for offset in range(0, len(memory), 4096):
        memory[offset] = 1
    print("READY", flush=True)
    time.sleep(60)
    """
)


def test_a_process_killed_at_the_deadline_has_ended_when_the_stop_returns() -> None:
    # The escalation kills ft_launcher right after this stop, and `nvtrain run` then reports the
    # tree gone: a worker still exiting then is one that outlived its stop (a CI run once saw one).
    done = subprocess.run(
        [sys.executable, "-c", KILLED_LATE, BIG], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["killed"] == [result["child"]], result
    assert result["left"] == [], result

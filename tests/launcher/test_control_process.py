"""``run_control``'s supervision with real processes: what ``nvtrain control`` does around the
store process (its own exit code passed through; SIGTERM forwarded, TERM -> stop_timeout -> KILL,
nothing left behind; exit 3 when its own name never resolves).

NVRx's ``nvrx-control`` needs NVRx 0.6+, which CI cannot install (it pins 0.4.1), so the store
process here is a small Python stand-in; the real one ran on NVRx 0.6.0 and 0.7.0 with
benchmarks/recovery/pod0_loss.py --store control (BENCHMARKS.md, "Losing pod 0"). Nothing here
claims to test recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.timeout(120)

# The stand-in store: starts a grandchild in a session of its own (as NVRx's helpers detach),
# says so, then exits with argv[1], or ignores SIGTERM and sleeps when argv[1] is "stubborn"
# (SIGTERM is ignored before the line is printed: the test signals as soon as it reads it).
STORE = r"""
import os, signal, subprocess, sys, time
stubborn = sys.argv[1] == "stubborn"
if stubborn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
print(f"STORE pid={os.getpid()} grandchild={g.pid}", flush=True)
if stubborn:
    time.sleep(300)
sys.exit(int(sys.argv[1]))
"""

DRIVER = r"""
import os, sys
from nvtrain.config.schema import Policy
from nvtrain.errors import NvtrainError
from nvtrain.launcher.control import ControlPlan, run_control

store_arg, wait_for, stop_timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
policy = Policy.model_validate(
    {
        "job": {"name": "ctl", "script": "t.py"},
        "rendezvous": {"nodes": 2, "store": "control", "dns_timeout": "2s"},
    }
)
plan = ControlPlan([sys.executable, "-c", sys.argv[4], store_arg], "x:1", "ctl", wait_for, stop_timeout)
try:
    code = run_control(plan, policy, os.environ, say=lambda text: print("SAY", text, flush=True))
except NvtrainError as exc:
    print("ERROR", exc, flush=True)
    code = int(exc.exit_code)
sys.exit(code)
"""


def start(
    tmp_path: Path, store_arg: str, wait_for: str = "localhost", stop_timeout: float = 2.0
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, store_arg, wait_for, str(stop_timeout), STORE],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def store_pids(line: str) -> list[int]:
    return [int(part.split("=")[1]) for part in line.split()[1:]]


def wait_for_line(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no {prefix!r} line; exit {proc.wait()}")


def rest(proc: subprocess.Popen[str]) -> str:
    """The rest of ``proc``'s output, once it has ended. Not ``communicate(timeout=...)``: that
    reads the pipe's descriptor and misses lines that ``wait_for_line``'s iteration has already
    buffered (the store's last line can come in one read with its first, under load)."""
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read()
    proc.wait(timeout=60)
    return out


def gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_the_store_process_exit_code_is_the_pods(tmp_path: Path) -> None:
    proc = start(tmp_path, "7")
    pids = store_pids(wait_for_line(proc, "STORE"))
    out = rest(proc)
    assert proc.returncode == 7, out
    assert "store process exited with 7" in out
    assert gone(pids), "the detached grandchild outlived nvtrain control"


def test_sigterm_is_forwarded_then_kill_after_stop_timeout_and_nothing_is_left(tmp_path: Path) -> None:
    proc = start(tmp_path, "stubborn", stop_timeout=2.0)
    pids = store_pids(wait_for_line(proc, "STORE"))
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    out = rest(proc)
    took = time.monotonic() - sent
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "signal SIGTERM" in out
    assert took >= 2.0, f"killed after {took:.1f}s, before stop_timeout"
    assert gone(pids), "a store process survived TERM -> deadline -> KILL"


def test_own_name_that_never_resolves_is_exit_3_naming_it(tmp_path: Path) -> None:
    proc = start(tmp_path, "0", wait_for="nvtrain-control-test.invalid")
    out = rest(proc)
    assert proc.returncode == 3, out
    assert "ERROR nvtrain-control-test.invalid did not resolve" in out
    assert "STORE" not in out  # the store process was never started

"""Processes: free ports, launcher command lines and the N-rank runner (one job in a process
group of its own, stopped with the whole group when it outlives its timeout)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tool(name: str, module: str) -> list[str]:
    """``<dir of sys.executable>/<name>`` (a console script of this environment), else
    ``python -m <module>``."""
    path = Path(sys.executable).parent / name
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


def nvtrain_argv(*args: str, python: str | None = None) -> list[str]:
    """``python -m nvtrain ARGS...`` (``python``: this interpreter unless given)."""
    return [python or sys.executable, "-m", "nvtrain", *args]


def nvtrain_run_argv(policy: Path, run_id: str, *, python: str | None = None) -> list[str]:
    """``python -m nvtrain run POLICY --run-id RUN_ID``."""
    return nvtrain_argv("run", str(policy), "--run-id", run_id, python=python)


def torchrun_argv(nproc: int, *args: str, standalone: bool = False) -> list[str]:
    """``python -m torch.distributed.run [--standalone] --nproc-per-node=N ARGS...``."""
    head = [sys.executable, "-m", "torch.distributed.run", *(["--standalone"] if standalone else [])]
    return [*head, f"--nproc-per-node={nproc}", *args]


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process group ``pid`` leads; a group that is gone already is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def stop_group(proc: subprocess.Popen[str] | subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM the group ``proc`` leads, SIGKILL it after ``grace`` seconds; its exit code."""
    kill_group(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, signal.SIGKILL)
        return proc.wait()


@dataclasses.dataclass
class Finished:
    """How one job run ended."""

    exit_code: int
    """The launcher's exit code; -9 when it was SIGKILLed at its timeout."""
    timed_out: bool
    start: float
    """Wall clock (``time.time()``) just before the launcher process was created."""
    end: float
    """Wall clock when it had exited."""
    wall_s: float
    """Monotonic seconds from the start to the exit."""
    pid: int


def run_job(
    argv: Sequence[str],
    log: Path,
    timeout: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    append: bool = False,
) -> Finished:
    """Run ``argv`` (``nvtrain run``, torchrun, ft_launcher: N ranks under one launcher) in a
    session of its own, stdout and stderr into ``log``; after ``timeout`` seconds SIGKILL its
    whole process group. Processes that left the group (torchrun starts workers in sessions of
    their own) are the caller's: ``nvtrain.launcher.process.kill_all`` after
    ``become_subreaper`` reaches them."""
    with log.open("ab" if append else "wb") as out:
        start, t0 = time.time(), time.monotonic()
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
        )
        timed_out = False
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc.pid)
            proc.wait()
            code = -9
        return Finished(code, timed_out, start, time.time(), time.monotonic() - t0, proc.pid)

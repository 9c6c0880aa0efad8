"""Helpers of the warm-start tests (``test_zygote*.py``): a server, clients, and waiting on them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SERVER_READY = 180.0
"""Seconds for the server to import torch and bind its socket on a loaded 2-core machine."""


def client_env(socket_path: Path | None) -> dict[str, str]:
    env = {**os.environ, "ZYGOTE_TEST": "value-42", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("NVTRAIN_ZYGOTE", None)
    if socket_path is not None:
        env["NVTRAIN_ZYGOTE"] = str(socket_path)
    return env


def start_server(
    tmp_path: Path, script: Path, name: str = "zygote.sock", gate: Path | None = None, umask: int = -1
) -> tuple[subprocess.Popen[bytes], Path]:
    """A server of ``script`` on ``tmp_path/name``, its output in ``tmp_path/name.log``;
    ``umask``: the server's (-1: this process's)."""
    socket_path = tmp_path / name
    log = (tmp_path / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nvtrain.zygote.server",
            "--socket",
            str(socket_path),
            "--script",
            str(script),
        ],
        # torch in the server uses every core; each worker takes its client's OMP_NUM_THREADS
        env={
            **{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
            **({"ZYGOTE_GATE": str(gate)} if gate is not None else {}),
        },
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        umask=umask,
    )
    log.close()
    return proc, socket_path


def wait_bound(proc: subprocess.Popen[bytes], socket_path: Path, log: Path) -> None:
    """Until the server's socket exists (it binds it before its imports)."""
    deadline = time.monotonic() + SERVER_READY
    while not socket_path.exists():
        assert proc.poll() is None, f"server exited {proc.returncode}: {log.read_text()}"
        assert time.monotonic() < deadline, f"no socket after {SERVER_READY}s: {log.read_text()}"
        time.sleep(0.02)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_request_sent(client: subprocess.Popen[str]) -> None:
    """Until the client catches SIGTERM: it installs its handlers just before it sends its
    request (a signal from then on is held, or ends the wait, or reaches the worker)."""
    bit = 1 << (signal.SIGTERM - 1)
    status = Path(f"/proc/{client.pid}/status")
    deadline = time.monotonic() + SERVER_READY
    while True:
        caught = next(line for line in status.read_text().splitlines() if line.startswith("SigCgt:"))
        if int(caught.split()[1], 16) & bit:
            return
        assert client.poll() is None and time.monotonic() < deadline, "the client never sent its request"
        time.sleep(0.01)


def start_client(
    script: Path, *args: str, socket_path: Path | None, cwd: Path, **kw: object
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nvtrain.zygote.client", str(script), *args],
        env=client_env(socket_path),
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,  # type: ignore[call-overload]
    )


def ready_line(proc: subprocess.Popen[str]) -> str:
    """The worker's "ready" line (it has installed its SIGTERM handler)."""
    assert proc.stdout is not None
    while "ready" not in (line := proc.stdout.readline()):
        assert line, "the worker ended before it was ready"
    return line

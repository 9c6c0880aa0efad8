"""The warm-start server and its client (``nvtrain.zygote``), as real processes: a worker forked
from the server behaves, to whoever started the client, as if the client had run the script
itself: argv, environment, working directory, stdin/stdout/stderr, exit code, death by signal,
forwarded signals; a killed client takes its worker with it; with no server (or one that
refused to serve) the client runs the script cold."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SERVER_READY = 180.0
"""Seconds for the server to import torch and bind its socket on a loaded 2-core machine."""

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    warm = "torch" in sys.modules  # imported by the server before the fork, not by this script
    import torch
    mode = sys.argv[1]
    env = os.environ.get("ZYGOTE_TEST")
    print(f"warm={warm} argv={sys.argv[1:]} cwd={os.getcwd()} env={env}", flush=True)
    print(f"threads={torch.get_num_threads()}", flush=True)
    if mode == "exit":
        print("to stderr", file=sys.stderr, flush=True)
        sys.exit(int(sys.argv[2]))
    if mode == "raise":
        raise RuntimeError("boom in the worker")
    if mode == "signal":
        os.kill(os.getpid(), int(sys.argv[2]))
    if mode == "stdin":
        print("read:" + sys.stdin.readline().strip(), flush=True)
    if mode in ("term", "wait"):
        def handler(signum, frame):
            print(f"got signal {signum}", flush=True)
            sys.exit(143)
        signal.signal(signal.SIGTERM, handler)
        print(f"ready pid={os.getpid()}", flush=True)
        while True:
            time.sleep(0.05)
    """
)


def _env(socket_path: Path | None) -> dict[str, str]:
    env = {**os.environ, "ZYGOTE_TEST": "value-42", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("NVTRAIN_ZYGOTE", None)
    if socket_path is not None:
        env["NVTRAIN_ZYGOTE"] = str(socket_path)
    return env


def _start_server(
    tmp_path: Path, script: Path, name: str = "zygote.sock"
) -> tuple[subprocess.Popen[bytes], Path]:
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
        env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    return proc, socket_path


def _wait_ready(proc: subprocess.Popen[bytes], socket_path: Path, log: Path) -> None:
    deadline = time.monotonic() + SERVER_READY
    while not socket_path.exists():
        assert proc.poll() is None, f"server exited {proc.returncode}: {log.read_text()}"
        assert time.monotonic() < deadline, f"server not ready after {SERVER_READY}s: {log.read_text()}"
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(socket path, script) of a server that is ready."""
    tmp = tmp_path_factory.mktemp("zygote")
    script = tmp / "worker.py"
    script.write_text(SCRIPT)
    proc, socket_path = _start_server(tmp, script)
    try:
        _wait_ready(proc, socket_path, tmp / "zygote.sock.log")
        yield socket_path, script
    finally:
        _stop(proc)


def _client(
    script: Path, *args: str, socket_path: Path | None, cwd: Path, **kw: object
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nvtrain.zygote.client", str(script), *args],
        env=_env(socket_path),
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,  # type: ignore[call-overload]
    )


def _ready(proc: subprocess.Popen[str]) -> str:
    """The worker's "ready" line (it has installed its SIGTERM handler)."""
    assert proc.stdout is not None
    while "ready" not in (line := proc.stdout.readline()):
        assert line, "the worker ended before it was ready"
    return line


def test_a_forked_worker_gets_argv_env_cwd_output_and_exit_code(
    server: tuple[Path, Path], tmp_path: Path
) -> None:
    socket_path, script = server
    with _client(script, "exit", "7", socket_path=socket_path, cwd=tmp_path) as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, (out, err)
    assert f"warm=True argv=['exit', '7'] cwd={tmp_path} env=value-42" in out
    assert "to stderr" in err
    assert "threads=1" in out  # OMP_NUM_THREADS of the client, not the server's


def test_stdin_is_the_clients(server: tuple[Path, Path], tmp_path: Path) -> None:
    socket_path, script = server
    with _client(script, "stdin", socket_path=socket_path, cwd=tmp_path, stdin=subprocess.PIPE) as proc:
        out, _ = proc.communicate("hello\n", timeout=120)
    assert proc.returncode == 0 and "read:hello" in out


def test_an_uncaught_exception_exits_1_with_its_traceback(server: tuple[Path, Path], tmp_path: Path) -> None:
    socket_path, script = server
    with _client(script, "raise", socket_path=socket_path, cwd=tmp_path) as proc:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "Traceback" in err and "RuntimeError: boom in the worker" in err


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT])
def test_a_worker_killed_by_a_signal_kills_its_client_with_it(
    server: tuple[Path, Path], tmp_path: Path, signum: int
) -> None:
    socket_path, script = server
    with _client(script, "signal", str(int(signum)), socket_path=socket_path, cwd=tmp_path) as proc:
        proc.communicate(timeout=120)
    assert proc.returncode == -signum


def test_sigterm_to_the_client_reaches_the_worker(server: tuple[Path, Path], tmp_path: Path) -> None:
    socket_path, script = server
    with _client(script, "term", socket_path=socket_path, cwd=tmp_path) as proc:
        _ready(proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143 and f"got signal {int(signal.SIGTERM)}" in out


def test_a_sigkilled_client_takes_its_worker_with_it(server: tuple[Path, Path], tmp_path: Path) -> None:
    socket_path, script = server
    with _client(script, "wait", socket_path=socket_path, cwd=tmp_path) as proc:
        line = _ready(proc)
        worker = psutil.Process(int(line.split("pid=")[1]))
        assert worker.pid != proc.pid and worker.ppid() != proc.pid  # forked by the server
        proc.kill()
        proc.wait()
    worker.wait(timeout=60)  # raises TimeoutExpired if it outlived its client


def test_without_a_server_the_client_runs_the_script_cold(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    with _client(script, "exit", "5", socket_path=tmp_path / "absent.sock", cwd=tmp_path) as proc:
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 5
    assert "warm=False argv=['exit', '5']" in out


def test_a_server_whose_imports_start_a_thread_refuses_and_clients_start_cold(tmp_path: Path) -> None:
    (tmp_path / "threaded_helper.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    )
    script = tmp_path / "worker.py"
    script.write_text("import threaded_helper\n" + SCRIPT)
    proc, socket_path = _start_server(tmp_path, script)
    log = tmp_path / "zygote.sock.log"
    try:
        deadline = time.monotonic() + SERVER_READY
        while "warm start: off" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert "started threads" in log.read_text()
        assert not socket_path.exists()
        with _client(script, "exit", "3", socket_path=socket_path, cwd=tmp_path) as client:
            out, _ = client.communicate(timeout=120)
        assert client.returncode == 3 and "warm=False" in out
    finally:
        _stop(proc)

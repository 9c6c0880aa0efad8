"""The warm-start server and its client (``nvtrain.zygote``), as real processes: a worker forked
from the server behaves, to whoever started the client, as if the client had run the script
itself: argv, environment, working directory, stdin/stdout/stderr, exit code, death by signal,
forwarded signals; a killed client takes its worker with it; with no server (or one that
refused to serve) the client runs the script cold."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from zygote_helpers import (
    SERVER_READY,
    client_env,
    ready_line,
    start_client,
    start_server,
    stop_server,
    wait_bound,
    wait_request_sent,
)

from nvtrain.zygote.wire import Reader, send
from support.proc_helpers import BIN
from support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

GATE = textwrap.dedent(
    """
    import os, time
    gate = os.environ.get("ZYGOTE_GATE")
    while gate and not os.path.exists(gate):  # the server's imports last until the test opens it
        time.sleep(0.01)
    """
)
"""``zygote_gate``, imported by the script: holds a server's imports until the file
``$ZYGOTE_GATE`` exists (a client has no ``ZYGOTE_GATE``: it never waits there)."""

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import zygote_gate
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


def _write_script(folder: Path, prefix: str = "") -> Path:
    (folder / "zygote_gate.py").write_text(GATE)
    script = folder / "worker.py"
    script.write_text(prefix + SCRIPT)
    return script


@dataclasses.dataclass
class Early:
    """Two clients that came while the server was still importing (its gate closed)."""

    waited: tuple[int, str]
    """Exit code and output of the one that waited for the imports."""
    stopped: int
    """Exit status of the one SIGTERMed while it waited."""
    stopped_output: str


@dataclasses.dataclass
class Served:
    socket: Path
    script: Path
    pid: int
    early: Early


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server that is serving, and the clients that came during its imports."""
    tmp = tmp_path_factory.mktemp("zygote")
    script = _write_script(tmp)
    gate = tmp / "gate"
    proc, socket_path = start_server(tmp, script, gate=gate)
    try:
        wait_bound(proc, socket_path, tmp / "zygote.sock.log")
        with (
            start_client(script, "exit", "4", socket_path=socket_path, cwd=tmp) as waiting,
            start_client(script, "wait", socket_path=socket_path, cwd=tmp) as stopped,
        ):
            # The gate is closed: the server cannot be serving. A client catches SIGTERM from
            # just before it sends its request (sent, it is queued); SIGTERM ends one that has
            # no worker yet at once, as it would end a cold one importing torch.
            wait_request_sent(stopped)
            stopped.send_signal(signal.SIGTERM)
            stopped.wait(timeout=60)  # its output's end is in the server's queue still
            assert waiting.poll() is None, "a client did not wait for the server's imports"
            gate.touch()
            out, err = waiting.communicate(timeout=SERVER_READY)
            # No worker was forked for the gone client: its stdout, which the server took
            # from the queue, ends with nothing written to it.
            stopped_out, stopped_err = stopped.communicate(timeout=60)
        early = Early((waiting.returncode, out + err), stopped.returncode, stopped_out + stopped_err)
        yield Served(socket_path, script, proc.pid, early)
    finally:
        stop_server(proc)


@pytest.fixture
def server(served: Served) -> tuple[Path, Path]:
    """(socket path, script) of a server that is serving."""
    return served.socket, served.script


def test_a_client_that_comes_during_the_imports_waits_and_gets_a_forked_worker(served: Served) -> None:
    code, out = served.early.waited
    assert code == 4, out
    assert "warm=True argv=['exit', '4']" in out


def test_a_client_stopped_before_its_worker_exists_dies_of_the_signal_and_gets_none(
    served: Served, tmp_path: Path
) -> None:
    assert served.early.stopped == -signal.SIGTERM
    assert served.early.stopped_output == ""
    # The server took the dead client's request from its queue before this one's, and has no
    # worker for it.
    with start_client(served.script, "exit", "0", socket_path=served.socket, cwd=tmp_path) as proc:
        out, _ = proc.communicate(timeout=120)
    assert "warm=True" in out
    leftover = [child.cmdline() for child in psutil.Process(served.pid).children()]
    assert leftover == [], leftover


def test_a_forked_worker_gets_argv_env_cwd_output_and_exit_code(
    server: tuple[Path, Path], tmp_path: Path
) -> None:
    socket_path, script = server
    with start_client(script, "exit", "7", socket_path=socket_path, cwd=tmp_path) as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, (out, err)
    assert f"warm=True argv=['exit', '7'] cwd={tmp_path} env=value-42" in out
    assert "to stderr" in err
    assert "threads=1" in out  # OMP_NUM_THREADS of the client, not the server's


@pytest.mark.parametrize("mode", ["abort", "thread", "open"])
def test_a_forked_worker_ends_as_a_cold_one_does(
    server: tuple[Path, Path], tmp_path: Path, mode: str
) -> None:
    # As nvtrain.entry ends a cold worker (tests/top/test_entry.py): no abort from an object
    # freed at exit, a non-daemon thread waited for, a file left open flushed.
    socket_path, _ = server
    out = tmp_path / mode
    with start_client(
        BIN / "ending_worker.py", mode, str(out), socket_path=socket_path, cwd=tmp_path
    ) as proc:
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, (stdout, stderr)
    assert "ENDING DONE" in stdout
    assert mode == "abort" or out.read_text() == mode


def test_stdin_is_the_clients(server: tuple[Path, Path], tmp_path: Path) -> None:
    socket_path, script = server
    with start_client(script, "stdin", socket_path=socket_path, cwd=tmp_path, stdin=subprocess.PIPE) as proc:
        out, _ = proc.communicate("hello\n", timeout=120)
    assert proc.returncode == 0 and "read:hello" in out


def test_an_uncaught_exception_exits_1_with_its_traceback(server: tuple[Path, Path], tmp_path: Path) -> None:
    socket_path, script = server
    with start_client(script, "raise", socket_path=socket_path, cwd=tmp_path) as proc:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "Traceback" in err and "RuntimeError: boom in the worker" in err


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT])
def test_a_worker_killed_by_a_signal_kills_its_client_with_it(
    server: tuple[Path, Path], tmp_path: Path, signum: int
) -> None:
    socket_path, script = server
    with start_client(script, "signal", str(int(signum)), socket_path=socket_path, cwd=tmp_path) as proc:
        proc.communicate(timeout=120)
    assert proc.returncode == -signum


def test_sigterm_to_the_client_reaches_the_worker(server: tuple[Path, Path], tmp_path: Path) -> None:
    socket_path, script = server
    with start_client(script, "term", socket_path=socket_path, cwd=tmp_path) as proc:
        ready_line(proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143 and f"got signal {int(signal.SIGTERM)}" in out


# The client, paused right after it has sent its request: until a byte comes on the fd in
# $PAUSE_FD. The pause stands for a loaded machine that runs the server and the worker first.
_PAUSED_CLIENT = """
import os, sys
import nvtrain.zygote.client as client
sent = client.send
def send_then_pause(*args, **kwargs):
    sent(*args, **kwargs)
    os.read(int(os.environ["PAUSE_FD"]), 1)
client.send = send_then_pause
client.main(sys.argv[1:])
"""


def test_a_sigterm_the_client_takes_while_it_has_not_run_since_its_request_reaches_the_worker(
    server: tuple[Path, Path], tmp_path: Path
) -> None:
    """Once the request is sent the server forks the worker, and the worker may print its first
    line before the client runs again (a loaded machine). A SIGTERM then once found the client
    with the default disposition: the client died alone, the server killed the worker, and
    ft_launcher saw a worker killed by SIGTERM instead of the script's own exit (143 here)."""
    socket_path, script = server
    pause, resume = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _PAUSED_CLIENT, str(script), "term"],
            env={**client_env(socket_path), "PAUSE_FD": str(pause)},
            pass_fds=(pause,),
            cwd=tmp_path,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.close(pause)
        pause = -1
        with proc:
            try:
                ready_line(proc)  # the worker runs while its client is paused after the request
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(BrokenPipeError):  # a client already dead: the assert says so
                    os.write(resume, b"g")  # the client's death, if it died, came before this
                out, err = proc.communicate(timeout=60)
            finally:
                proc.kill()
    finally:
        os.close(resume)
        if pause >= 0:
            os.close(pause)
    assert proc.returncode == 143, (proc.returncode, out, err)
    assert f"got signal {int(signal.SIGTERM)}" in out, out


def test_a_sigkilled_client_takes_its_worker_with_it_and_the_server_serves_on(
    served: Served, tmp_path: Path
) -> None:
    with start_client(served.script, "wait", socket_path=served.socket, cwd=tmp_path) as proc:
        try:
            line = ready_line(proc)
            worker = psutil.Process(int(line.split("pid=")[1]))
            assert worker.pid != proc.pid and worker.ppid() != proc.pid  # forked by the server
        finally:
            proc.kill()
        proc.wait()
    worker.wait(timeout=60)  # raises TimeoutExpired if it outlived its client
    # The server reaped a worker whose client had gone first; it once died of that (a KeyError),
    # and every later worker of the pod started cold.
    with start_client(served.script, "exit", "0", socket_path=served.socket, cwd=tmp_path) as proc:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "warm=True" in out, (out, err)
    assert psutil.Process(served.pid).status() != psutil.STATUS_ZOMBIE


def test_a_signal_that_comes_with_the_workers_pid_reaches_the_worker(tmp_path: Path) -> None:
    """The server names the worker to its client before the worker runs anything, so a signal
    the client takes once the worker could have printed a line finds that name in the client's
    socket, read or not, and goes to the worker. (It once ended the client alone, and the server
    then killed the worker: a SIGTERM right after the worker's first line, under load.) Here the
    test plays the server: the client is stopped while the pid and a SIGTERM reach it."""
    socket_path = tmp_path / "played.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen(1)
    listener.settimeout(SERVER_READY)
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # "the worker"
    script = _write_script(tmp_path)
    with listener, start_client(script, "wait", socket_path=socket_path, cwd=tmp_path) as client:
        try:
            conn, _ = listener.accept()
            with conn:
                reader = Reader(conn)
                request = reader.read()
                for fd in reader.fds:
                    os.close(fd)
                assert request is not None and request["argv"][1:] == ["wait"], request
                wait_request_sent(client)
                client.send_signal(signal.SIGSTOP)
                wait_until(
                    lambda: psutil.Process(client.pid).status() == psutil.STATUS_STOPPED,
                    30,
                    "the client stopped",
                    interval=0.01,
                )
                send(conn, {"pid": stand_in.pid})
                client.send_signal(signal.SIGTERM)
                client.send_signal(signal.SIGCONT)
                assert stand_in.wait(timeout=60) == -signal.SIGTERM  # TimeoutExpired: not forwarded
                send(conn, {"signal": int(signal.SIGTERM)})
                client.wait(timeout=60)
            assert client.returncode == -signal.SIGTERM
        finally:
            stand_in.kill()
            stand_in.wait()
            client.kill()


def test_without_a_server_the_client_runs_the_script_cold(tmp_path: Path) -> None:
    script = _write_script(tmp_path)
    with start_client(script, "exit", "5", socket_path=tmp_path / "absent.sock", cwd=tmp_path) as proc:
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 5
    assert "warm=False argv=['exit', '5']" in out


def _queued_client(
    tmp_path: Path, prefix: str = "", args: tuple[str, ...] = ("exit", "3")
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[str], Path]:
    """A server held in its imports (gate closed) and a client waiting for it: (server, client,
    gate)."""
    script = _write_script(tmp_path, prefix)
    gate = tmp_path / "gate"
    proc, socket_path = start_server(tmp_path, script, gate=gate)
    wait_bound(proc, socket_path, tmp_path / "zygote.sock.log")
    return proc, start_client(script, *args, socket_path=socket_path, cwd=tmp_path), gate


def test_a_server_whose_imports_start_a_thread_refuses_and_waiting_clients_start_cold(
    tmp_path: Path,
) -> None:
    (tmp_path / "threaded_helper.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    )
    proc, client, gate = _queued_client(tmp_path, "import threaded_helper\n")
    log = tmp_path / "zygote.sock.log"
    try:
        wait_request_sent(client)  # queued before the server refused
        gate.touch()
        with client:
            out, _ = client.communicate(timeout=120)
        assert client.returncode == 3 and "warm=False" in out
        assert "warm start: off" in log.read_text() and "started threads" in log.read_text()
        assert not (tmp_path / "zygote.sock").exists()
    finally:
        stop_server(proc)


def test_a_server_killed_during_its_imports_leaves_its_waiting_clients_to_start_cold(
    tmp_path: Path,
) -> None:
    proc, client, _gate = _queued_client(tmp_path, args=("wait",))
    try:
        wait_request_sent(client)  # queued: it connected before the server died
        proc.kill()  # the gate stays closed: the server dies in its imports
        with client:
            line = ready_line(client)  # the script runs in the client itself
            assert int(line.split("pid=")[1]) == client.pid, line
            # ... with a new interpreter's signal handling: SIGINT raises KeyboardInterrupt
            client.send_signal(signal.SIGINT)
            out, err = client.communicate(timeout=120)
        assert "KeyboardInterrupt" in err, (out, err)
    finally:
        stop_server(proc)

"""The warm-start server against what can go wrong around it (issue 36), as real processes:
a worker and its client that end in the same ``select`` batch, in either order; connections that
send nothing, half a request, or garbage (a seeded fuzz of the wire format: set
``ZYGOTE_FUZZ_SEED`` to try another seed); no descriptors left; another user (``nobody``, through
``setpriv``) at the socket; a socket folder others may enter; and the server's own death, which
the workers outlive: each client still ends with its worker's status.

A "same batch" is made by stopping the server (SIGSTOP), letting both ends happen, and letting
it go on (SIGCONT): both are ready when it next selects, in the order they happened."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import resource
import select
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from zygote_helpers import SERVER_READY, ready_line, start_client, start_server, stop_server, wait_bound

from support.proc_helpers import _not_here
from support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NOBODY = 65534
REQUEST_TIMEOUT = 5.0
"""The server's ``REQUEST_TIMEOUT``; these tests import nothing of the server's, so that they
also run against the code before issue 36 and show what it did."""
MAX_MESSAGE = 1 << 20
"""``nvtrain.zygote.wire.MAX_MESSAGE``."""
FUZZ_SEED = int(os.environ.get("ZYGOTE_FUZZ_SEED", "36"))
"""The fuzz's seed: ``ZYGOTE_FUZZ_SEED=N pytest tests/zygote/test_zygote_hardening.py -k fuzz``
runs it with another (a failure names the seed)."""
FUZZ_ROUNDS = 2
FUZZ_CONNECTIONS = 80
"""Connections open at once in each round of the fuzz: more than the server reads at once
(``MAX_PENDING``, 64), so that some wait in its queue for others to be done."""

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    warm = "torch" in sys.modules  # imported by the server before the fork: this script does not
    mode = sys.argv[1]
    print(f"warm={warm} uid={os.getuid()}", flush=True)
    if mode == "exit":
        sys.exit(int(sys.argv[2]))
    if mode == "marker":
        with open(sys.argv[2], "w") as f:
            f.write(str(os.getuid()))
        sys.exit(0)
    if mode not in ("wait", "gate"):
        sys.exit(2)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"ready pid={os.getpid()}", flush=True)
    while mode == "wait" or not os.path.exists(sys.argv[2]):  # "gate FILE CODE": until FILE exists
        time.sleep(0.01)
    sys.exit(int(sys.argv[3]))
    """
)
"""A worker that imports nothing heavy: started cold (a refused client), it costs little."""


@dataclasses.dataclass
class Light:
    proc: subprocess.Popen[bytes]
    socket: Path
    script: Path
    log: Path
    idle: set[int]
    """The server's descriptors while it has no connection and no worker."""

    @property
    def pid(self) -> int:
        return self.proc.pid


def _fds(pid: int) -> set[int]:
    return {int(name) for name in os.listdir(f"/proc/{pid}/fd")}


def _links(pid: int) -> list[str]:
    """What the descriptors of ``pid`` are: "socket", "pipe", "anon_inode" or a path."""
    return [os.readlink(f"/proc/{pid}/fd/{fd}").split(":[")[0] for fd in _fds(pid)]


def _until(what: str, done: Callable[[], bool], timeout: float = 60.0) -> None:
    wait_until(done, timeout, what, interval=0.01)


def _status(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return "gone"


def _run(
    script: Path, *args: str, socket_path: Path, cwd: Path, timeout: float = 120
) -> tuple[int, str, str]:
    with start_client(script, *args, socket_path=socket_path, cwd=cwd) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            proc.kill()
    return proc.returncode, out, err


def _serving(proc: subprocess.Popen[bytes], socket_path: Path, script: Path, folder: Path) -> None:
    """Until the server has done its imports and forks workers."""
    wait_bound(proc, socket_path, socket_path.with_name(socket_path.name + ".log"))
    code, out, err = _run(script, "exit", "0", socket_path=socket_path, cwd=folder, timeout=SERVER_READY)
    assert code == 0 and "warm=True" in out, (out, err)


def _idle(light: Light) -> None:
    """Until the server has closed every connection and reaped every worker."""

    def idle() -> bool:
        return _fds(light.pid) == light.idle and not psutil.Process(light.pid).children()

    with contextlib.suppress(AssertionError):
        _until("idle", idle)
    if not idle():
        now = _fds(light.pid)
        extra = {fd: os.readlink(f"/proc/{light.pid}/fd/{fd}") for fd in now - light.idle}
        workers = [(c.pid, c.status(), c.cmdline()) for c in psutil.Process(light.pid).children()]
        pytest.fail(
            f"the server is not idle: descriptors {extra} more, {light.idle - now} fewer, workers {workers}: "
            + light.log.read_text()
        )


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Light]:
    folder = tmp_path_factory.mktemp("hardening")
    script = folder / "light.py"
    script.write_text(SCRIPT)
    proc, socket_path = start_server(folder, script)
    try:
        _serving(proc, socket_path, script, folder)
        # reaped, then its connection closed: the listener is the one socket left
        _until(
            "the first worker reaped and its connection closed",
            lambda: not psutil.Process(proc.pid).children() and _links(proc.pid).count("socket") == 1,
        )
        yield Light(proc, socket_path, script, folder / "zygote.sock.log", _fds(proc.pid))
    finally:
        stop_server(proc)


def _alive(light: Light) -> None:
    assert light.proc.poll() is None, light.log.read_text()


@pytest.mark.parametrize("first", ["worker", "client"])
def test_a_worker_and_its_client_that_end_in_one_batch_leave_the_server_serving(
    light: Light, tmp_path: Path, first: str
) -> None:
    """The server once died of a KeyError when its worker's end came before its client's in one
    batch (the worker's handler had forgotten the pid that the client's looked up); every other
    client then killed its worker, and later workers started cold."""
    with start_client(light.script, "wait", socket_path=light.socket, cwd=tmp_path) as client:
        try:
            worker = psutil.Process(int(ready_line(client).split("pid=")[1]))
            os.kill(light.pid, signal.SIGSTOP)
            try:
                _until("the server stopped", lambda: _status(light.pid) == psutil.STATUS_STOPPED)
                if first == "client":
                    client.kill()
                    client.wait()
                worker.kill()
                _until("the worker a zombie", lambda: _status(worker.pid) == psutil.STATUS_ZOMBIE)
                if first == "worker":
                    client.kill()
                    client.wait()  # its descriptors are closed before it can be waited for
            finally:
                os.kill(light.pid, signal.SIGCONT)
        finally:
            client.kill()
    code, out, err = _run(light.script, "exit", "0", socket_path=light.socket, cwd=tmp_path)
    assert code == 0 and "warm=True" in out, (out, err, light.log.read_text())
    _idle(light)
    _alive(light)


def encode(message: dict[str, object]) -> bytes:
    """A message as the client sends it (``nvtrain.zygote.wire``)."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    return sock


def _closed_by_server(sock: socket.socket, timeout: float = 60.0) -> list[bytes]:
    """Everything the server sends until it closes the connection (within ``timeout``)."""
    sock.settimeout(timeout)
    got = []
    with contextlib.suppress(ConnectionResetError):
        while data := sock.recv(1 << 16):
            got.append(data)
    return got


def test_a_silent_or_half_sent_request_holds_up_no_one_and_is_closed_with_its_descriptors(
    light: Light, tmp_path: Path
) -> None:
    """The server once read each request with a blocking call: a connection that sent nothing
    held up every later client (a job's restart waited 98 s), and dead clients' workers lived on
    meanwhile."""
    silent = _connect(light.socket)
    half = _connect(light.socket)
    read_end, write_end = os.pipe()
    try:
        # the pipe's write end goes to the server only: its end shows the server closed it
        socket.send_fds(half, [b'{"argv": ["x"], "scr'], [write_end] * 3)
        os.close(write_end)
        write_end = -1
        code, out, err = _run(light.script, "exit", "5", socket_path=light.socket, cwd=tmp_path, timeout=60)
        assert code == 5 and "warm=True" in out, (out, err)
        started = time.monotonic()
        for sock in (silent, half):
            assert _closed_by_server(sock) == []
        assert select.select([read_end], [], [], 60)[0] and os.read(read_end, 1) == b""
        assert time.monotonic() - started < REQUEST_TIMEOUT + 60
        _idle(light)
        _alive(light)
    finally:
        silent.close()
        half.close()
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def _request(light: Light, cwd: Path, *args: str) -> dict[str, object]:
    return {
        "argv": [str(light.script), *args],
        "script": str(light.script),
        "module": None,
        "cwd": str(cwd),
        "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1"},
    }


class _Fds:
    """Descriptors of every kind a client could send, kept until the round's end."""

    def __init__(self, rng: random.Random, folder: Path) -> None:
        self.rng = rng
        self.folder = folder
        self.keep: list[socket.socket | select.epoll] = []
        self.fds: list[int] = []

    def one(self) -> int:
        kind = self.rng.randrange(7)
        if kind == 0:
            read_end, write_end = os.pipe()
            self.fds += [read_end, write_end]
            return self.rng.choice([read_end, write_end])
        if kind == 1:
            fd = os.open(os.devnull, os.O_RDONLY)
        elif kind == 2:
            fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        elif kind == 3:
            fd = os.eventfd(0)
        elif kind == 4:
            pair = socket.socketpair()
            self.keep += pair
            return pair[0].fileno()
        elif kind == 5:
            poll = select.epoll()
            self.keep.append(poll)
            return poll.fileno()
        else:
            fd = os.open(self.folder / "out", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.fds.append(fd)
        return fd

    def some(self, n: int) -> list[int]:
        return [self.one() for _ in range(n)]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        for item in self.keep:
            item.close()


def _wrong(rng: random.Random, request: dict[str, object]) -> dict[str, object]:
    """``request`` with one field wrong: missing, of another type, or script and module both."""
    bad = dict(request)
    key = rng.choice(["argv", "script", "module", "cwd", "env"])
    values: list[object] = [None, 7, 1.5, "text", [], [1, 2], {"a": 1}, {"a": None}, [None], True]
    if rng.random() < 0.2:
        del bad[key]
    elif key == "module":
        bad["module"] = "some.module"  # with a script: both
    else:
        bad[key] = rng.choice([v for v in values if not (key in ("script", "cwd") and v == "text")])
    return bad


def _fuzz_one(rng: random.Random, light: Light, cwd: Path, fds: _Fds) -> tuple[socket.socket, str]:
    """One connection with one kind of trouble sent; returns it and what was sent."""
    sock = _connect(light.socket)
    valid = encode(_request(light, cwd, "exit", "0"))
    kind = rng.randrange(13)
    what = f"kind {kind}"
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if kind == 0:
            what = "nothing"
        elif kind == 1:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 3000))).replace(b"\n", b"")
            socket.send_fds(sock, [data], fds.some(rng.randint(0, 3)))
        elif kind == 2:
            socket.send_fds(
                sock, [bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300))) + b"\n"], fds.some(3)
            )
        elif kind == 3:
            line = rng.choice([b"[]", b"1", b"null", b'"x"', b"true", b"[{}]", b"{", b"\xff\xfe", b""])
            socket.send_fds(sock, [line + b"\n"], fds.some(3))
        elif kind == 4:
            depth = rng.randint(10_000, 200_000)
            socket.send_fds(sock, [b"[" * depth + b"]" * depth + b"\n"], fds.some(3))
        elif kind == 5:
            socket.send_fds(sock, [encode(_wrong(rng, _request(light, cwd, "exit", "0")))], fds.some(3))
        elif kind == 6:
            socket.send_fds(sock, [valid], fds.some(rng.choice([0, 1, 2, 4, 6])))
        elif kind == 7:
            what = "a valid request with descriptors of any kind"
            socket.send_fds(sock, [valid], fds.some(3))
        elif kind == 8:
            size = MAX_MESSAGE + rng.randint(1, 1 << 16)
            data = b'{"argv": ["' + b"a" * size + (b'"]}\n' if rng.random() < 0.5 else b"")
            socket.send_fds(sock, [data[:100]], fds.some(3))
            sock.sendall(data[100:])
        elif kind == 9:
            cut = sorted(rng.sample(range(1, len(valid)), 3))
            pieces = [valid[a:b] for a, b in zip([0, *cut], [*cut, len(valid)], strict=True)]
            keep = rng.randint(1, len(pieces))  # all of them: a whole request, in pieces
            with_fds = rng.randrange(keep)
            for i, piece in enumerate(pieces[:keep]):
                socket.send_fds(sock, [piece], fds.some(3) if i == with_fds else [])
            what = f"a request in {len(pieces)} pieces, {keep} sent"
        elif kind == 10:
            socket.send_fds(sock, [valid[:10]], fds.some(3))
            socket.send_fds(sock, [valid[10:]], fds.some(3))
        elif kind == 11:
            socket.send_fds(sock, [valid], fds.some(3))
            what = "a valid request, then gone"
            sock.close()
        else:
            request = _request(light, cwd, "exit", "0")
            request["extra"] = {"nested": [1, 2, {"x": "y"}]}
            line = encode(request).replace(b"exit", bytes([rng.getrandbits(8)]) * 4, 1)
            socket.send_fds(sock, [line], fds.some(3))
        if rng.random() < 0.3 and sock.fileno() >= 0:
            sock.shutdown(socket.SHUT_WR)
            what += ", then shut for writing"
    return sock, what


def test_a_fuzz_of_the_wire_format_leaves_the_server_serving(light: Light, tmp_path: Path) -> None:
    """Garbage, truncated, nested too deep, oversized, wrongly typed requests, too many or too
    few descriptors, descriptors of any kind: each connection is closed (at once, or at its
    deadline, or when the worker it got has ended), with its descriptors; the server serves on."""
    rng = random.Random(FUZZ_SEED)
    forked = 0
    for round_ in range(FUZZ_ROUNDS):
        fds = _Fds(rng, tmp_path)
        sent: list[tuple[socket.socket, str]] = []
        try:
            for i in range(FUZZ_CONNECTIONS):
                try:
                    sent.append(_fuzz_one(rng, light, tmp_path, fds))
                except OSError as exc:
                    pytest.fail(
                        f"seed {FUZZ_SEED}, round {round_}, connection {i}: {exc!r}: {light.log.read_text()}"
                    )
            fds.close()  # what the server took it holds alone now
            for i, (sock, what) in enumerate(sent):
                if sock.fileno() >= 0:
                    try:
                        forked += b'"pid"' in b"".join(_closed_by_server(sock))
                    except TimeoutError:
                        pytest.fail(
                            f"seed {FUZZ_SEED}, round {round_}, connection {i} ({what}): never closed"
                        )
        finally:
            for sock, _ in sent:
                sock.close()
        assert light.proc.poll() is None, f"seed {FUZZ_SEED}: the server died: {light.log.read_text()}"
    code, out, err = _run(light.script, "exit", "4", socket_path=light.socket, cwd=tmp_path)
    assert code == 4 and "warm=True" in out, (FUZZ_SEED, out, err, light.log.read_text())
    _idle(light)  # every descriptor the fuzz sent was closed, every worker reaped
    assert forked > 0, f"seed {FUZZ_SEED}: no request of the fuzz got a worker"
    assert "dropped a connection" not in light.log.read_text()


def test_with_no_descriptors_left_a_request_is_dropped_or_waits_and_the_server_serves_on(
    light: Light, tmp_path: Path
) -> None:
    """``RLIMIT_NOFILE`` lowered on the running server so that, in turn, each descriptor a
    request needs is the one that cannot be had: the connection (``accept``), the client's
    stdin/stdout/stderr, the pipe that releases the worker. The server once died of the first and
    the last (an uncaught OSError): every worker of the pod then started cold."""
    _idle(light)
    limits = resource.prlimit(light.pid, resource.RLIMIT_NOFILE)
    try:
        for step in range(6):
            free = sorted(set(range(max(light.idle) + 8)) - light.idle)
            # accept takes free[0], the request's descriptors free[1:4], the pipe free[4:6]
            resource.prlimit(light.pid, resource.RLIMIT_NOFILE, (free[step], limits[1]))
            with start_client(light.script, "exit", "0", socket_path=light.socket, cwd=tmp_path) as client:
                try:
                    if step == 0:  # it waits in the queue until the server can accept again
                        _until(
                            "the server told it cannot accept",
                            lambda: "cannot accept" in light.log.read_text(),
                        )
                        assert client.poll() is None
                        resource.prlimit(light.pid, resource.RLIMIT_NOFILE, limits)
                    out, err = client.communicate(timeout=120)
                finally:
                    client.kill()
            resource.prlimit(light.pid, resource.RLIMIT_NOFILE, limits)
            assert client.returncode == 0, (step, out, err)
            # refused for lack of descriptors, the client ran the script itself
            assert f"warm={step == 0}" in out, (step, out, err, light.log.read_text())
            _alive(light)
            _idle(light)
        assert light.log.read_text().count("dropped a connection") == 2  # the pipe's two ends
    finally:
        if light.proc.poll() is None:
            resource.prlimit(light.pid, resource.RLIMIT_NOFILE, limits)
    code, out, err = _run(light.script, "exit", "0", socket_path=light.socket, cwd=tmp_path)
    assert code == 0 and "warm=True" in out, (out, err)


# -- another user ----------------------------------------------------------------------------------

PROBE = textwrap.dedent(
    """
    import json, socket, sys
    path, script, marker = sys.argv[1:4]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except PermissionError:
        print("refused: EACCES")
        sys.exit(0)
    request = {"argv": [script, "marker", marker], "script": script, "module": None,
               "cwd": "/", "env": {"PATH": "/usr/bin:/bin"}}
    try:
        socket.send_fds(sock, [json.dumps(request).encode() + b"\\n"], [0, 1, 2])
        sock.settimeout(60)
        data = sock.recv(4096)
    except OSError as exc:
        print(f"closed: {exc!r}")
        sys.exit(0)
    print("closed" if not data else "answered: " + data.decode())
    """
)
"""Connects as a client would and asks for a worker that writes ``marker``: prints what came."""


@dataclasses.dataclass
class Open:
    """A server started under ``umask 000`` in a folder of /tmp that ``nobody`` may pass
    through once the server has started (it checked the folder then)."""

    proc: subprocess.Popen[bytes]
    socket: Path
    script: Path
    folder: Path


def _as_nobody(*argv: str) -> str:
    done = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def open_umask() -> Iterator[Open]:
    if os.geteuid() != 0:
        _not_here("acting as another user (nobody) needs root")
    if shutil.which("setpriv") is None or not os.access("/usr/bin/python3", os.X_OK):
        _not_here("needs setpriv (util-linux) and /usr/bin/python3 to act as another user")
    folder = Path(tempfile.mkdtemp(prefix="nvt-z", dir="/tmp"))
    script = folder / "light.py"
    script.write_text(SCRIPT)
    proc, socket_path = start_server(folder, script, umask=0)
    try:
        _serving(proc, socket_path, script, folder)
        folder.chmod(0o711)  # nobody may reach the socket's name now, not list the folder
        yield Open(proc, socket_path, script, folder)
    finally:
        stop_server(proc)
        shutil.rmtree(folder, ignore_errors=True)


def test_the_socket_is_this_users_alone_whatever_the_umask(open_umask: Open) -> None:
    """The server once left the socket's mode to its umask: under ``umask 000`` any user could
    connect, and ``nobody`` had the server run a script as root."""
    assert stat.S_IMODE(os.stat(open_umask.socket).st_mode) == 0o600
    marker = open_umask.folder / "marker-umask"
    probe = _as_nobody(
        "/usr/bin/python3", "-c", PROBE, str(open_umask.socket), str(open_umask.script), str(marker)
    )
    assert probe == "refused: EACCES"
    assert not marker.exists()


def test_a_connection_of_another_user_is_closed_before_anything_is_read(open_umask: Open) -> None:
    """Even with the socket opened to all by hand, ``SO_PEERCRED`` names the peer's user: the
    connection is closed at once, no worker is forked, and one line says so."""
    log = open_umask.socket.with_name("zygote.sock.log")
    marker = open_umask.folder / "marker-peercred"
    os.chmod(open_umask.socket, 0o666)
    try:
        probe = _as_nobody(
            "/usr/bin/python3", "-c", PROBE, str(open_umask.socket), str(open_umask.script), str(marker)
        )
    finally:
        os.chmod(open_umask.socket, 0o600)
    assert probe.startswith("closed"), probe
    assert not marker.exists()
    assert psutil.Process(open_umask.proc.pid).children() == []
    assert f"refused the connections of uid {NOBODY}" in log.read_text()
    code, out, err = _run(
        open_umask.script, "exit", "0", socket_path=open_umask.socket, cwd=open_umask.folder
    )
    assert code == 0 and "warm=True" in out, (out, err)  # this user's clients are served on


def test_a_server_whose_socket_folder_others_may_enter_refuses_and_clients_start_cold(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o755)
    script = tmp_path / "light.py"
    script.write_text(SCRIPT)
    proc, socket_path = start_server(folder, script)
    log = folder / "zygote.sock.log"
    try:
        _until(
            "the server refused or bound its socket",
            lambda: socket_path.exists() or "warm start: off" in log.read_text(),
            SERVER_READY,
        )
        assert not socket_path.exists(), log.read_text()
        assert f"the socket's folder {folder} has mode 0755" in log.read_text()
        code, out, _ = _run(script, "exit", "6", socket_path=socket_path, cwd=tmp_path)
        assert code == 6 and "warm=False" in out
        assert proc.poll() is None  # it waits to be stopped, as a refusing server does
    finally:
        stop_server(proc)


# -- the server's death ----------------------------------------------------------------------------


def test_the_servers_death_leaves_its_workers_running_and_each_client_ends_as_its_worker(
    tmp_path: Path,
) -> None:
    """A server killed while three workers run: they run on; one ends by itself (exit 3), one
    by a SIGTERM its client passes on (143), one is killed outright, which its client says in a
    line (exit 1). Clients once killed their workers the moment the server's connection ended."""
    script = tmp_path / "light.py"
    script.write_text(SCRIPT)
    gate = tmp_path / "gate"
    proc, socket_path = start_server(tmp_path, script)
    workers: list[psutil.Process] = []
    try:
        _serving(proc, socket_path, script, tmp_path)
        with (
            start_client(script, "gate", str(gate), "3", socket_path=socket_path, cwd=tmp_path) as by_itself,
            start_client(script, "wait", socket_path=socket_path, cwd=tmp_path) as termed,
            start_client(script, "wait", socket_path=socket_path, cwd=tmp_path) as killed,
        ):
            clients = (by_itself, termed, killed)
            try:
                workers += [psutil.Process(int(ready_line(c).split("pid=")[1])) for c in clients]
                os.kill(proc.pid, signal.SIGKILL)  # the server alone, not its group
                proc.wait()
                for worker in workers:
                    assert _status(worker.pid) not in ("gone", psutil.STATUS_ZOMBIE)
                workers[2].kill()
                _, err = killed.communicate(timeout=60)
                assert killed.returncode == 1
                assert f"worker {workers[2].pid} ended without a word: killed" in err, err
                gate.touch()
                _, err = by_itself.communicate(timeout=60)
                assert by_itself.returncode == 3, err
                assert f"the server is gone; worker {workers[0].pid} ended with exit code 3" in err, err
                assert workers[1].is_running() and termed.poll() is None
                termed.send_signal(signal.SIGTERM)
                termed.communicate(timeout=60)
                assert termed.returncode == 143
            finally:
                for c in clients:
                    c.kill()
    finally:
        for worker in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()
        stop_server(proc)


def test_a_request_whose_client_is_gone_before_it_is_read_gets_no_worker(
    light: Light, tmp_path: Path
) -> None:
    """Sent whole, then the client gone, all while the server was stopped: it reads the request
    and the end together and forks nothing (the marker a worker would write stays absent)."""
    marker = tmp_path / "marker"
    os.kill(light.pid, signal.SIGSTOP)
    try:
        _until("the server stopped", lambda: _status(light.pid) == psutil.STATUS_STOPPED)
        sock = _connect(light.socket)
        with sock, open(os.devnull, "w") as null:
            socket.send_fds(
                sock, [encode(_request(light, tmp_path, "marker", str(marker)))], [null.fileno()] * 3
            )
    finally:
        os.kill(light.pid, signal.SIGCONT)
    code, out, err = _run(light.script, "exit", "0", socket_path=light.socket, cwd=tmp_path)
    assert code == 0 and "warm=True" in out, (out, err)
    _idle(light)
    assert not marker.exists()

"""The rendezvous store of ``nvtrain run`` against other users and other hosts.

- A one-node run's store, and every socket ft_launcher listens on, is bound to loopback.
- Another local user (``nobody``, through ``setpriv``) who connects to the store and writes a
  pickled payload into the rendezvous key ``torch.rendezvous.<run id>`` (NVRx's rendezvous reads
  that key back with ``pickle.loads``) runs nothing: ft_launcher's allow-listed unpickler refuses
  the state, the launcher's log names what it named, and the run ends.
- The allow-list (``[rendezvous] store_allow``, a BPF filter on the listening socket): from a
  second network namespace a peer address in the list connects and uses the store, another
  address of the same peer does not get through.

Acting as another user and making network namespaces need root; elsewhere these tests are
skipped (failed in CI, which sets NVTRAIN_MULTINODE=require).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from nvtrain.launcher.plan import LAUNCHER_MODULE
from support.otheruser import skip_unless_nobody_can_import
from support.proc_helpers import BIN, NvtrainRunner, Running, _not_here, make_policy, write_policy
from support.waiting import wait_until

pytestmark = pytest.mark.slow

NOBODY = 65534
# Run as nobody: connect to the store as a client and overwrite the rendezvous state with a
# pickle that, unpickled, creates the marker file.
ATTACK = """
import base64, datetime, os, pickle, sys
from torch.distributed import TCPStore
port, run_id, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3]
class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))
store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
store.set("torch.rendezvous." + run_id, base64.b64encode(pickle.dumps(Payload())))
print("WROTE", flush=True)
"""


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[NvtrainRunner]:
    runner = NvtrainRunner(tmp_path)
    yield runner
    runner.close()


def _start(runner: NvtrainRunner, tmp_path: Path) -> tuple[Running, dict[str, object], int]:
    """A one-node run of two gloo ranks that hold their group open until ``tmp_path/go``;
    returns it once both ranks are up, with what rank 0 said (run id, MASTER_PORT) and the port."""
    folder = tmp_path / "w"
    folder.mkdir()
    folder.chmod(0o755)
    _, tables = make_policy(tmp_path, script=str(BIN / "store_wait_worker.py"), args=[str(folder)])
    tables["job"]["backend"] = "gloo"
    policy = write_policy(tmp_path, tables)
    run = runner.start("-v", str(policy))
    ready = [folder / f"ready-{rank}" for rank in (0, 1)]
    wait_until(
        lambda: all(path.exists() for path in ready),
        120,
        "both ranks up",
        alive=lambda: run.proc.poll() is None,
        detail=run.describe,
    )
    said = json.loads(ready[0].read_text(encoding="utf-8"))
    return run, said, int(tables["rendezvous"]["port"])


def _launcher(run: Running) -> psutil.Process:
    for child in psutil.Process(run.pid).children(recursive=True):
        if LAUNCHER_MODULE in " ".join(child.cmdline()):
            return child
    raise AssertionError(f"no ft_launcher among the run's processes\n{run.describe()}")


def _end(run: Running, tmp_path: Path) -> int:
    (tmp_path / "w" / "go").touch()
    return run.wait(90)


def test_one_node_store_and_launcher_listen_on_loopback_only(runner: NvtrainRunner, tmp_path: Path) -> None:
    run, said, port = _start(runner, tmp_path)
    launcher = _launcher(run)
    listening = [c for c in launcher.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    addresses = {(c.laddr.ip, c.laddr.port) for c in listening}
    assert ("127.0.0.1", port) in addresses, f"the store is not on 127.0.0.1:{port}: {addresses}"
    exposed = {a for a in addresses if not ipaddress.ip_address(a[0]).is_loopback}
    assert not exposed, f"ft_launcher listens beyond loopback: {exposed}"
    assert "store bound to the endpoint's address" in run.stdout + run.stderr
    assert _end(run, tmp_path) == 0, run.describe()
    assert said["master_port"] != port


def test_another_user_cannot_run_code_through_the_store(runner: NvtrainRunner, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        _not_here("acting as another user (nobody) needs root")
    if shutil.which("setpriv") is None:
        _not_here("needs setpriv (util-linux) to act as another user")
    skip_unless_nobody_can_import("torch")  # the attacker's TCPStore client is this Python's torch
    run, said, port = _start(runner, tmp_path)
    marker = tmp_path / "pwned"
    attack = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        + [sys.executable, "-c", ATTACK, str(port), str(said["run_id"]), str(marker)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={**os.environ, "HOME": "/", "TMPDIR": "/tmp"},
        check=False,
    )
    assert attack.returncode == 0 and "WROTE" in attack.stdout, attack.stderr[-3000:]
    # The launcher reads the state back within a monitor tick; the old code ran the payload.
    wait_until(
        lambda: marker.exists() or "refused the rendezvous state" in run.stdout + run.stderr,
        60,
        "the launcher reading the state nobody wrote",
        alive=lambda: run.proc.poll() is None,
        detail=run.describe,
    )
    code = _end(run, tmp_path)
    assert not marker.exists(), f"the payload ran as root in ft_launcher\n{run.describe()}"
    text = run.stdout + run.stderr
    assert "names posix.system" in text, run.describe()
    assert code != 0, run.describe()  # the rendezvous failed: the run ends rather than goes on forged


@pytest.fixture
def namespaces() -> Iterator[tuple[str, str]]:
    """Two network namespaces joined by a veth pair: the store's (10.213.7.1) and a peer's,
    which has two addresses (10.213.7.2 and 10.213.7.3)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        _not_here("network namespaces need root and iproute2")
    tag = uuid.uuid4().hex[:6]
    store, peer = f"nvt-sg-{tag}-s", f"nvt-sg-{tag}-p"
    made: list[str] = []
    try:
        for ns in (store, peer):
            subprocess.run(["ip", "netns", "add", ns], check=True, timeout=20)
            made.append(ns)
        steps = [
            [
                "ip",
                "link",
                "add",
                f"sg{tag}s",
                "netns",
                store,
                "type",
                "veth",
                "peer",
                f"sg{tag}p",
                "netns",
                peer,
            ],
            ["ip", "-n", store, "addr", "add", "10.213.7.1/24", "dev", f"sg{tag}s"],
            ["ip", "-n", peer, "addr", "add", "10.213.7.2/24", "dev", f"sg{tag}p"],
            ["ip", "-n", peer, "addr", "add", "10.213.7.3/24", "dev", f"sg{tag}p"],
            ["ip", "-n", store, "link", "set", f"sg{tag}s", "up"],
            ["ip", "-n", peer, "link", "set", f"sg{tag}p", "up"],
            ["ip", "-n", store, "link", "set", "lo", "up"],
            ["ip", "-n", peer, "link", "set", "lo", "up"],
        ]
        for step in steps:
            subprocess.run(step, check=True, timeout=20, capture_output=True)
    except (OSError, subprocess.SubprocessError) as exc:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], check=False, timeout=20)
        _not_here(f"cannot make network namespaces here: {exc}")
    yield store, peer
    for ns in made:
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=20)


# In the store's namespace: a TCPStore server on the guard's socket (allow-list 10.213.7.2),
# which says READY and serves until its stdin closes.
SERVE = """
import datetime, ipaddress, sys
from torch.distributed import TCPStore
from nvtrain.nvrx.storeguard import listening_socket
sock = listening_socket("10.213.7.1", int(sys.argv[1]), [ipaddress.IPv4Network("10.213.7.2/32")])
store = TCPStore("10.213.7.1", int(sys.argv[1]), is_master=True, master_listen_fd=sock.detach(),
                 timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
store.set("hello", "from the store")
print("READY", flush=True)
sys.stdin.read()
"""
# In the peer's namespace: a connection from each source address (5 s to connect), then the
# store used as a client by the allowed one.
PROBE = """
import datetime, socket, sys
from torch.distributed import TCPStore
port = int(sys.argv[1])
for source in ("10.213.7.2", "10.213.7.3"):
    s = socket.socket()
    s.settimeout(5)
    s.bind((source, 0))
    try:
        s.connect(("10.213.7.1", port))
        print(source, "connected", flush=True)
    except OSError as exc:
        print(source, "refused", type(exc).__name__, flush=True)
    s.close()
store = TCPStore("10.213.7.1", port, is_master=False, timeout=datetime.timedelta(seconds=20))
print("GOT", store.get("hello").decode(), flush=True)
"""


def test_allow_list_admits_only_the_listed_addresses(namespaces: tuple[str, str], tmp_path: Path) -> None:
    store_ns, peer_ns = namespaces
    port = 29555  # a namespace of its own: no other process can hold it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with subprocess.Popen(
        ["ip", "netns", "exec", store_ns, sys.executable, "-c", SERVE, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as server:
        assert server.stdin is not None and server.stdout is not None and server.stderr is not None
        try:
            line = server.stdout.readline()  # READY, or nothing when it failed
            assert line.strip() == "READY", line + server.stderr.read()[-3000:]
            probe = subprocess.run(
                ["ip", "netns", "exec", peer_ns, sys.executable, "-c", PROBE, str(port)],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
                check=False,
            )
        finally:
            server.stdin.close()  # the server's cue to end
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
    said = probe.stdout + probe.stderr[-2000:]
    assert "10.213.7.2 connected" in probe.stdout, said
    assert "10.213.7.3 refused" in probe.stdout, said
    assert "GOT from the store" in probe.stdout, said

"""The stores the workers host (rank 0) listen on MASTER_ADDR's address, not on every interface.

A one-node run of two gloo ranks of the worker library (``store_bind_worker.py``) under
``nvtrain run`` and the real ft_launcher, held open while the test looks:

- every socket the workers listen on is bound to an address, none to ``0.0.0.0`` or ``::``;
  rank 0's stores (``MASTER_PORT``: torch's ``env://`` store, or NVRx's Wrapper store under
  in-process restart; ``MASTER_PORT + 1``: nvtrain's in-process store) on MASTER_ADDR's own
  address (``worker/stores.py``); before, torch bound them on every interface;
- another user (``nobody``) who connects to those ports on this host's other address gets no
  connection (it did, before), and the run still ends 0.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from support.otheruser import skip_unless_nobody_can_import
from support.proc_helpers import BIN, NvtrainRunner, Running, _not_here, make_policy, write_policy
from support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NOBODY = 65534
# Run as nobody: connect to each port on the given address (5 s each); say what happened.
PROBE = """
import socket, sys
address = sys.argv[1]
for port in sys.argv[2:]:
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((address, int(port)))
        print(port, "connected", flush=True)
    except OSError as exc:
        print(port, "refused", type(exc).__name__, flush=True)
    s.close()
"""


@pytest.fixture
def runner(tmp_path: Path) -> Any:
    runner = NvtrainRunner(tmp_path)
    yield runner
    runner.close()


def _start(runner: NvtrainRunner, tmp_path: Path, in_process: bool) -> tuple[Running, list[dict[str, Any]]]:
    """The run, once both ranks are up; with what each rank said (pid, MASTER_ADDR/PORT)."""
    folder = tmp_path / "w"
    folder.mkdir()
    _, tables = make_policy(
        tmp_path,
        script=str(BIN / "store_bind_worker.py"),
        args=[str(folder)],
        max_restarts=0,
        heartbeat={"timeout": "120s", "initial_timeout": "150s"},
    )
    tables["job"].update({"backend": "gloo", "collective_timeout": "45s"})
    if in_process:
        tables["restart.in_process"] = {"enabled": True, "soft_timeout": "60s", "hard_timeout": "90s"}
    run = runner.start(str(write_policy(tmp_path, tables)))
    ready = [folder / f"ready-{rank}" for rank in (0, 1)]
    wait_until(
        lambda: all(path.exists() for path in ready),
        150,
        "both ranks up",
        alive=lambda: run.proc.poll() is None,
        detail=run.describe,
    )
    return run, [json.loads(path.read_text(encoding="utf-8")) for path in ready]


def _listening(pid: int) -> set[tuple[str, int]]:
    connections = psutil.Process(pid).net_connections(kind="tcp")
    return {(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}


def _end(run: Running, tmp_path: Path) -> int:
    (tmp_path / "w" / "go").touch()
    return run.wait(120)


def _store_ports(said: dict[str, Any], in_process: bool) -> list[int]:
    port = int(said["master_port"])
    return [port, port + 1] if in_process else [port]


@pytest.mark.parametrize("in_process", [False, True], ids=["env", "in_process"])
def test_the_workers_stores_listen_on_master_addr_only(
    runner: NvtrainRunner, tmp_path: Path, in_process: bool
) -> None:
    run, said = _start(runner, tmp_path, in_process)
    listening = {rank: _listening(int(s["pid"])) for rank, s in enumerate(said)}
    own = {str(info[4][0]) for info in socket.getaddrinfo(said[0]["master_addr"], None)}
    code = _end(run, tmp_path)
    wildcard = {
        rank: {a for a in found if ipaddress.ip_address(a[0]).is_unspecified}
        for rank, found in listening.items()
    }
    assert wildcard == {0: set(), 1: set()}, f"the workers listen on every interface: {wildcard}"
    for port in _store_ports(said[0], in_process):
        bound = {ip for ip, p in listening[0] if p == port}
        assert bound and bound <= own, f"rank 0's store on port {port}: {bound}, MASTER_ADDR's: {own}"
    assert code == 0, run.describe()
    assert "STORE BIND DONE rank=0" in run.stdout, run.describe()


def _other_address() -> str:
    """An IPv4 address of this host other than loopback (skip where there is none)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not ipaddress.ip_address(address.address).is_loopback:
                return str(address.address)
    _not_here("this host has no IPv4 address but loopback")
    raise AssertionError("not reached")


def test_another_user_cannot_reach_the_workers_stores_from_outside_loopback(
    runner: NvtrainRunner, tmp_path: Path
) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        _not_here("acting as another user (nobody) needs root and setpriv")
    skip_unless_nobody_can_import("socket")
    address = _other_address()
    run, said = _start(runner, tmp_path, in_process=True)
    if ipaddress.ip_address(socket.gethostbyname(said[0]["master_addr"])).is_loopback is False:
        _end(run, tmp_path)
        _not_here(f"MASTER_ADDR {said[0]['master_addr']!r} is not loopback here: its address is reachable")
    ports = _store_ports(said[0], in_process=True)
    probe = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        + [sys.executable, "-c", PROBE, address, *map(str, ports)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={**os.environ, "HOME": "/", "TMPDIR": "/tmp"},
        check=False,
    )
    code = _end(run, tmp_path)
    for port in ports:
        assert f"{port} refused" in probe.stdout, (
            f"nobody reached {address}:{port}: {probe.stdout}{probe.stderr}"
        )
    assert code == 0, run.describe()

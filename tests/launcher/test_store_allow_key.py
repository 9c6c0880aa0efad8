"""``[rendezvous] store_allow`` and the rendezvous state's unpickler, without a run.

- The key takes IPv4 addresses, CIDRs and host names; anything else is a finding that names the
  key, the entry and an example. Every node's plan passes the list to ft_launcher and its
  workers (``$NVTRAIN_STORE_ALLOW``).
- The ``pickle`` that the guarded rendezvous modules see reads a real rendezvous state back and
  refuses one that names ``os.system`` (nothing of it runs); a bad allow-list ends ft_launcher
  with exit 2 and a line that names it.
- The store's socket: bound to the address asked for, with a filter attached whose list leaves
  loopback out still takes loopback (its own host); at most ``MAX_NETWORKS`` networks. (Which
  sources the filter drops: tests/launcher/test_store_guard.py, across network namespaces.)
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from test_plan import multinode_policy, node_identity, plan_for

from nvtrain.nvrx import NvrxVersion, storeguard

NVRX_04 = NvrxVersion.parse("0.4.1")


@pytest.mark.parametrize("entry", ["10.0.0.300", "::1", "fe80::/64", "a b", "1.2.3.4/40", "-", ""])
def test_a_bad_entry_names_the_key_entry_and_an_example(entry: str) -> None:
    with pytest.raises(ValidationError) as caught:
        multinode_policy(store_allow=["10.0.0.1", entry])
    text = str(caught.value)
    assert "store_allow" in text and repr(entry) in text and 'store_allow = ["10.0.0.11"' in text


def test_every_node_passes_the_list_on() -> None:
    # Node 0's ft_launcher guards the rendezvous store with it; every node's workers guard the
    # stores rank 0 hosts (the node of MASTER_ADDR, not always the store's host).
    policy = multinode_policy(store_allow=["10.0.0.10", "10.0.1.0/24", "node02"])
    for node in (0, 1):
        assert plan_for(policy, node_identity(node), NVRX_04).env[storeguard.ALLOW_ENV] == (
            "10.0.0.10 10.0.1.0/24 node02"
        )
    assert storeguard.ALLOW_ENV not in plan_for(multinode_policy(), node_identity(0), NVRX_04).env


_GUARDED = r"""
import datetime, json, os, pickle, sys

from nvtrain.nvrx import storeguard


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


said = []
done = storeguard.install({}, log=said.append)
import nvidia_resiliency_ext.fault_tolerance._ft_rendezvous as rdzv

state = rdzv._RendezvousState()
node = rdzv._NodeDesc("10.0.0.10", 4242, 0)
state.participants[node] = 0
state.last_heartbeats[node] = datetime.datetime.now()
state.deadline = datetime.datetime.now()
back = rdzv.pickle.loads(pickle.dumps(state))
read_back = back.participants == {node: 0} and back.deadline == state.deadline
try:
    rdzv.pickle.loads(pickle.dumps(Payload(sys.argv[1])))
except storeguard.RendezvousStateRefused as exc:
    refused = str(exc)
else:
    refused = None
print(json.dumps({"done": done, "read_back": read_back, "refused": refused, "said": said}))
"""
"""Installs the guard in a process of its own (it patches the torch and NVRx modules of the
process it runs in, which must not be pytest's), reads a real rendezvous state back through it,
then a payload that names ``os.system``; prints what it saw as JSON."""


def test_the_guarded_rendezvous_reads_its_state_and_refuses_code(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    marker = tmp_path / "pwned"
    ran = subprocess.run(
        [sys.executable, "-c", _GUARDED, str(marker)], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout.splitlines()[-1])
    done = seen["done"]
    assert any("rendezvous state unpickled allow-listed (NVRx's rendezvous)" in d for d in done), done
    assert seen["read_back"], seen
    assert seen["refused"] is not None and re.search("posix.system|os.system", seen["refused"]), seen
    assert not marker.exists()
    assert any("refused the rendezvous state" in line for line in seen["said"]), seen


def test_a_bad_allow_list_ends_ft_launcher_with_a_line_that_names_it() -> None:
    pytest.importorskip("torch")
    code = "from nvtrain.nvrx import storeguard; storeguard.install()"
    env = {**os.environ, storeguard.ALLOW_ENV: "10.0.0.1 no-such-host.invalid"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "$NVTRAIN_STORE_ALLOW" in done.stderr and "'no-such-host.invalid'" in done.stderr


def test_an_allow_list_that_cannot_be_applied_refuses_to_run() -> None:
    # An NVRx (or torch) whose c10d backend makes its store some other way: the list cannot be
    # put on the store's socket, so the launcher must not start with the store open to all.
    pytest.importorskip("torch")
    code = (
        "import importlib\n"
        "from nvtrain.nvrx import storeguard\n"
        "for name in storeguard.STORE_MODULES:\n"
        "    try:\n"
        "        module = importlib.import_module(name)\n"
        "    except ImportError:\n"
        "        continue\n"
        "    module._create_tcp_store = lambda params, extra=None: None  # another signature\n"
        "storeguard.install()\n"
        "print('ran')\n"
    )
    env = {**os.environ, storeguard.ALLOW_ENV: "10.0.0.1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "ran" not in done.stdout
    assert "[rendezvous] store_allow) is set, but this NVRx creates its rendezvous store" in done.stderr
    # Without a list the same NVRx runs (its store unfiltered, as before).
    env.pop(storeguard.ALLOW_ENV)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr


def _connects(port: int, timeout: float = 3.0) -> bool:
    with socket.socket() as client:
        client.settimeout(timeout)
        try:
            client.connect(("127.0.0.1", port))
            client.sendall(b"x")
        except OSError:
            return False
        return True


def test_the_filter_admits_listed_sources_and_the_stores_own_host() -> None:
    listed = storeguard.listening_socket("127.0.0.1", 0, [ipaddress.IPv4Network("10.9.9.0/24")])
    with listed:
        assert listed.getsockname()[0] == "127.0.0.1"
        assert _connects(listed.getsockname()[1])  # loopback: always allowed
    program = storeguard.allow_filter([ipaddress.IPv4Network("10.9.9.0/24")])
    assert len(program) == 8 * (3 + 3 + 2)
    with pytest.raises(ValueError, match="at most"):
        storeguard.allow_filter(ipaddress.IPv4Network(f"10.0.{i}.0/24") for i in range(81))

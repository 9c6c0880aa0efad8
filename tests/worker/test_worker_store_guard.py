"""What NVRx reads back from the workers' in-process store runs no code.

NVRx's ``StoreMixin.get_states`` (``inprocess/store.py``, the rank states its ``Tree`` rank
assignment reads) unpickles what the store holds. Here a real rank 0 hosts nvtrain's in-process
store as the worker does (``nvtrain.worker.stores.inprocess_base_store``, which guards NVRx's
unpickling), another user (``nobody``) writes a pickle into the key where rank 1's state goes,
and rank 0 reads the states through NVRx's own ``get_states``: the value is refused, the
worker's line names what it named, and the file the payload would make is not there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.otheruser import skip_unless_nobody_can_import
from support.ports import free_port_pair
from support.proc_helpers import _not_here

pytestmark = pytest.mark.slow

NOBODY = 65534
# Rank 0 of 2: hosts the store at MASTER_PORT + 1, says READY, and once told (a line on stdin)
# reads rank 1's state through NVRx's own StoreMixin.get_states.
RANK0 = """
import datetime, sys
from nvidia_resiliency_ext.inprocess.store import PrefixStore
from nvtrain.worker import stores
base = stores.inprocess_base_store(2, hosts=True, timeout=datetime.timedelta(seconds=30))
print("READY", flush=True)
sys.stdin.readline()
try:
    print("READ", PrefixStore(0, base).get_states([1]), flush=True)
except Exception as exc:
    print("FAILED", type(exc).__name__, exc, flush=True)
"""
# As nobody: a client of that store, writing a pickle that, unpickled, makes the marker file.
ATTACK = """
import datetime, os, pickle, sys
from torch.distributed import TCPStore
port, marker = int(sys.argv[1]), sys.argv[2]
class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))
store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
store.set("_inprocess_0/state_1", pickle.dumps(Payload()))
print("WROTE", flush=True)
"""


def test_a_pickle_another_user_writes_into_the_inprocess_store_runs_nothing(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        _not_here("acting as another user (nobody) needs root and setpriv")
    skip_unless_nobody_can_import("torch")
    port = free_port_pair()
    marker = tmp_path / "pwned"
    tmp_path.chmod(0o777)  # the payload, run as root or as nobody, could make the marker
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "2",
        "GROUP_WORLD_SIZE": "1",
    }
    with subprocess.Popen(
        [sys.executable, "-c", RANK0],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as rank0:
        assert rank0.stdin is not None and rank0.stdout is not None and rank0.stderr is not None
        try:
            line = rank0.stdout.readline()  # READY, or nothing when it failed
            assert line.strip() == "READY", line + rank0.stderr.read()[-3000:]
            attack = subprocess.run(
                ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
                + [sys.executable, "-c", ATTACK, str(port + 1), str(marker)],
                capture_output=True,
                text=True,
                timeout=120,
                cwd="/",
                env={**os.environ, "HOME": "/", "TMPDIR": "/tmp"},
                check=False,
            )
            assert attack.returncode == 0 and "WROTE" in attack.stdout, attack.stderr[-3000:]
            rank0.stdin.write("go\n")
            rank0.stdin.flush()
            out, err = rank0.communicate(timeout=60)
        finally:
            if rank0.poll() is None:
                rank0.kill()
    assert not marker.exists(), f"the payload ran in rank 0\n{out}\n{err[-3000:]}"
    assert "FAILED InprocessStoreRefused" in out, out + err[-3000:]
    assert "names posix.system" in err, err[-3000:]

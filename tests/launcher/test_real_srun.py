"""``srun -N1 nvtrain run ...`` under a real Slurm (Debian's ``slurmctld``, ``slurmd`` and
``munge``, started here in a folder of their own): the variables a real ``srun`` sets are those
``nvtrain.launcher.slurm`` reads, and the job's run id comes from ``SLURM_JOB_ID``.

Skipped where Slurm is not installed (``apt-get install -y --no-install-recommends slurmd
slurmctld slurm-client munge``) or not as root (``slurmd`` starts the job's processes). The
multi-node case, with Slurm's variables as ``srun`` sets them: tests/launcher/multinode/test_bare_metal.py.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.ports import free_port
from support.proc_helpers import BIN, read_events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sinfo")


def _slurm_conf(folder: Path, node: str, ctld_port: int, slurmd_port: int) -> str:
    return f"""\
ClusterName=nvt
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={folder}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


REQUIRE = os.environ.get("NVTRAIN_SLURM", "").strip().lower() == "require"
"""``NVTRAIN_SLURM=require`` (CI): missing Slurm fails the test instead of skipping it; read at
import, before the autouse fixture clears NVTRAIN_ variables."""


@pytest.fixture
def slurm() -> Iterator[dict[str, str]]:
    """A one-node Slurm cluster on this machine; yields the environment that points at it."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        why = f"needs root and Slurm ({', '.join(missing) or 'root'} missing)"
        if REQUIRE:  # CI installs Debian's Slurm: there a skip would hide a broken set-up
            pytest.fail(why)
        pytest.skip(why)
    folder = Path(tempfile.mkdtemp(prefix="nvs-"))  # short: munge's socket path
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        (folder / "state").mkdir()
        (folder / "spool").mkdir()
        subprocess.run(["mungekey", "-c", "-f", "-k", str(folder / "munge.key")], check=True, timeout=30)
        node = socket.gethostname().split(".")[0]
        conf = folder / "slurm.conf"
        conf.write_text(_slurm_conf(folder, node, free_port(), free_port()), encoding="utf-8")
        env = {**os.environ, "SLURM_CONF": str(conf)}
        starts = [
            ["munged", "-F", "--force", f"--key-file={folder}/munge.key", f"--socket={folder}/munge.sock",
             f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
             f"--seed-file={folder}/munged.seed"],
            ["slurmctld", "-D", "-f", str(conf)],
            ["slurmd", "-D", "-f", str(conf), "-N", node],
        ]  # fmt: skip
        with (folder / "daemons.log").open("ab") as logs:  # each daemon keeps its own copy
            for argv in starts:
                daemons.append(
                    subprocess.Popen(argv, env=env, stdout=logs, stderr=logs, stdin=subprocess.DEVNULL)
                )
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            done = subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=30
            )
            state = done.stdout.strip()
            if state == "idle":
                break
            time.sleep(0.2)
        else:
            pytest.fail(
                f"Slurm did not come up (node state {state!r}): {(folder / 'daemons.log').read_text()}"
            )
        yield {"SLURM_CONF": str(conf)}
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in reversed(daemons):
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def test_srun_one_node(slurm: dict[str, str], tmp_path: Path) -> None:
    settings = tmp_path / "settings.toml"
    settings.write_text(
        f'[job]\nname = "srun"\n[checkpoint]\ndir = "{tmp_path / "ckpt"}"\n', encoding="utf-8"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NVTRAIN_"))}
    env = {**clean, **slurm, "TMPDIR": tempfile.gettempdir()}
    argv = ["srun", "-N1", "--ntasks-per-node=1", "-t", "3", sys.executable, "-m", "nvtrain", "run"]
    argv += ["--policy", str(settings), str(BIN / "noop_worker.py"), "--workers", "4"]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = re.findall(r"WORKER RAN rank=0 args=(\[.*\])", done.stdout)
    assert [ast.literal_eval(args) for args in seen] == [["--workers", "4"]], done.stdout + done.stderr
    runs = list((tmp_path / "ckpt").glob("srun-slurm-*"))
    assert len(runs) == 1 and re.fullmatch(r"srun-slurm-\d+", runs[0].name), runs
    events = read_events(runs[0])
    assert [e["exit_code"] for e in events if e["event"] == "launcher_exit"] == [0], events

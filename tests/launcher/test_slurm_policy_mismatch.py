"""``srun nvtrain run`` whose job size disagrees with the step's: the real ``nvtrain run``
(``--dry-run``, one process per task) with the variables that ``srun`` sets, no slurmd needed.
A task that would run as another job (a one-node policy on each node of ``srun -N2``, which
would share one run id, events log and step folders) is exit 2 on every node, naming Slurm's
variables, the policy's key and the fix; a size that fits still starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NODES = ["cn07", "cn08", "cn09", "cn10"]


def srun_env(node: int, nodes: int) -> dict[str, str]:
    """What ``srun -N<nodes> --ntasks-per-node=1`` sets for the task on node ``node`` of job 777
    (as a real srun does: tests/launcher/test_real_srun.py)."""
    listed = f"cn[07-{6 + nodes:02d}]" if nodes > 1 else "cn07"
    return {
        "SLURM_JOB_ID": "777",
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NODELIST": listed,
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_STEP_NODELIST": listed,
        "SLURM_STEP_TASKS_PER_NODE": f"1(x{nodes})",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node),
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": NODES[node],
    }


def write_policy(tmp_path: Path, rendezvous: str) -> Path:
    (tmp_path / "train.py").write_text("print('trained')\n", encoding="utf-8")
    policy = tmp_path / "policy.toml"
    policy.write_text(
        f'[job]\nname = "llm"\nscript = "{tmp_path / "train.py"}"\n\n[rendezvous]\n{rendezvous}\n'
        f'[checkpoint]\ndir = "{tmp_path / "ckpt"}"\n',
        encoding="utf-8",
    )
    return policy


def nvtrain_run(
    tmp_path: Path, env: dict[str, str], *args: str, dry_run: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvtrain", "run", *(["--dry-run"] if dry_run else []), *args],
        env={**os.environ, **env},  # conftest cleared SLURM_*, NVTRAIN_* and Kubernetes' names
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def refused(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    said = " ".join(done.stderr.split())  # rich may wrap a long line
    assert done.returncode == 2, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in said, f"{needle!r} not in:\n{done.stderr}"


@pytest.mark.parametrize("node", [0, 1])
def test_a_one_node_policy_on_a_two_node_step_is_refused_on_every_node(tmp_path: Path, node: int) -> None:
    policy = write_policy(tmp_path, "nodes = 1")
    done = nvtrain_run(tmp_path, srun_env(node, 2), str(policy))
    refused(
        done,
        f"SLURM_STEP_NUM_NODES=2, SLURM_NODEID={node}, SLURM_JOB_ID=777",
        f"[rendezvous] nodes = 1 in {policy}:6 asks for 1 node(s)",
        "share one run id, events log and step folders",
        f"set [rendezvous] nodes = 2 in {policy}",
        "srun -N1 --ntasks-per-node=1",
    )
    assert not (tmp_path / "ckpt").exists()  # nothing of a run was made


def test_the_refused_task_starts_nothing(tmp_path: Path) -> None:
    # Without --dry-run: the task on node 1 would have trained as node 0 of a one-node job,
    # writing the events log and step folders of llm-slurm-777 that node 0's task writes too.
    policy = write_policy(tmp_path, "nodes = 1")
    done = nvtrain_run(tmp_path, srun_env(1, 2), str(policy), dry_run=False)
    refused(done, "SLURM_NODEID=1", "nvtrain run does not start it as another job")
    assert "trained" not in done.stdout, done.stdout
    assert not (tmp_path / "ckpt").exists(), sorted(str(p) for p in (tmp_path / "ckpt").rglob("*"))


@pytest.mark.parametrize(
    ("flags", "says", "fix"),
    [
        (["--nnodes", "1"], "--nnodes 1 asks for 1 node(s)", "pass --nnodes 2 instead of --nnodes 1"),
        (["--standalone"], "--standalone asks for 1 node(s)", "pass --nnodes 2 instead of --standalone"),
        (["--nnodes", "4"], "would wait for 2 more node(s)", "srun -N4 --ntasks-per-node=1"),
        (["--nnodes", "3:4"], "asks for 3 to 4 nodes", "pass --nnodes 2 instead of --nnodes 3:4"),
    ],
)
def test_a_job_size_from_the_command_line_that_the_step_cannot_have_is_refused(
    tmp_path: Path, flags: list[str], says: str, fix: str
) -> None:
    (tmp_path / "train.py").write_text("print('trained')\n", encoding="utf-8")
    done = nvtrain_run(tmp_path, srun_env(1, 2), *flags, "train.py")
    refused(done, "SLURM_STEP_NUM_NODES=2, SLURM_NODEID=1", says, fix)


def test_a_step_larger_than_the_job_is_refused_on_its_first_nodes_too(tmp_path: Path) -> None:
    # Node 0 and 1 of `srun -N4` would start a 2-node job without nodes 2 and 3.
    policy = write_policy(tmp_path, "nodes = 2")
    done = nvtrain_run(tmp_path, srun_env(0, 4), str(policy))
    refused(done, "SLURM_STEP_NUM_NODES=4", "nodes 2 to 3 of the step would have no place in the job")


@pytest.mark.parametrize(
    ("rendezvous", "flags", "nnodes"),
    [
        ("nodes = 2", [], "2:2"),
        ("", [], "2:2"),
        ("nodes = 4\nmin_nodes = 2", [], "2:4"),
        ("", ["--nnodes", "1:2"], "1:2"),
    ],
)
def test_a_size_that_fits_the_step_still_starts(
    tmp_path: Path, rendezvous: str, flags: list[str], nnodes: str
) -> None:
    policy = write_policy(tmp_path, rendezvous)
    done = nvtrain_run(tmp_path, srun_env(1, 2), *flags, str(policy))
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert f"--nnodes={nnodes}" in plan["argv"], plan["argv"]
    assert plan["env"]["NVTRAIN_NODE_RANK"] == "1" and plan["env"]["NVTRAIN_RUN_ID"] == "llm-slurm-777"
    assert plan["endpoint"] == "cn07:29500"

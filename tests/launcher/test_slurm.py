"""``launcher.slurm``: Slurm's compressed node lists and a task's place in its step, from the
variables as ``srun`` sets them."""

from __future__ import annotations

import dataclasses

import pytest

from nvtrain.errors import UsageError
from nvtrain.launcher.slurm import expand, from_env, tasks_per_node


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("node01", ["node01"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("gpu[8-10],login1", ["gpu8", "gpu9", "gpu10", "login1"]),
        ("n[008-010]", ["n008", "n009", "n010"]),
        ("a[1-2]-ib,b[3]", ["a1-ib", "a2-ib", "b3"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    ],
)
def test_node_lists_expand_in_order(hostlist: str, hosts: list[str]) -> None:
    assert expand(hostlist) == hosts


@pytest.mark.parametrize(
    ("hostlist", "says"),
    [
        ("", "empty"),
        ("node[1-3", "unbalanced"),
        ("node1]", "unbalanced"),
        ("a,,b", "empty name"),
        ("node[3-1]", "backwards"),
        ("node[a-b]", "not a number"),
        ("n[1-999999999]", "more than"),
        ("r[1-1000]n[1-1000]", "more than"),
    ],
)
def test_bad_node_lists_say_why(hostlist: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        expand(hostlist)


def test_tasks_per_node() -> None:
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("1") == [1]
    with pytest.raises(ValueError, match="tasks-per-node"):
        tasks_per_node("two")


def srun_env(node: int, **extra: str) -> dict[str, str]:
    """What `srun -N4 --ntasks-per-node=1` sets for the task on node ``node`` of job 4242 in an
    allocation of 8 tasks per node (the variables of a real srun: tests/launcher/test_real_srun.py)."""
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_NNODES": "4",
        "SLURM_JOB_NODELIST": "gpu[01-03,07]",
        "SLURM_STEP_NUM_NODES": "4",
        "SLURM_STEP_NODELIST": "gpu[01-03,07]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x4)",
        "SLURM_TASKS_PER_NODE": "8(x4)",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_STEP_ID": "0",
        "SLURM_NODEID": str(node),
        "SLURMD_NODENAME": ["gpu01", "gpu02", "gpu03", "gpu07"][node],
        "SLURM_PROCID": str(node),
        "SLURM_LOCALID": "0",
        **extra,
    }


def test_a_task_of_a_step_knows_its_place() -> None:
    step = from_env(srun_env(3))
    assert step is not None
    assert (step.job_id, step.node_rank, step.nodes) == ("4242", 3, 4)
    assert step.store_host == "gpu01" and step.node_name == "gpu07"
    assert step.nproc is None  # no GPUs: nothing to say (SLURM_NTASKS_PER_NODE is the step's 1)
    with_gpus = from_env(srun_env(0, SLURM_GPUS_ON_NODE="4"))
    assert with_gpus is not None and with_gpus.nproc == 4


def test_the_step_wins_over_the_job() -> None:
    # `srun -N2` inside a 4-node allocation: the step's two nodes, the first of them hosts.
    env = srun_env(
        1, SLURM_STEP_NUM_NODES="2", SLURM_STEP_NODELIST="gpu[03,07]", SLURM_STEP_TASKS_PER_NODE="1(x2)"
    )
    step = from_env(env)
    assert step is not None and (step.nodes, step.store_host) == (2, "gpu03")


def test_the_batch_script_is_not_a_step() -> None:
    # The batch script of `sbatch -N4 --ntasks-per-node=8` (SLURM_NODEID is set there too).
    batch = {k: v for k, v in srun_env(0).items() if not k.startswith(("SLURM_STEP", "SLURMD"))}
    step = from_env(batch)
    assert step is not None and step.batch and step.nodes == 4  # the allocation's, for the caller
    assert from_env(srun_env(0)) == dataclasses.replace(step, node_name="gpu01", batch=False)


def test_not_slurm() -> None:
    assert from_env({}) is None
    assert from_env({"SLURM_JOB_ID": "1"}) is None  # e.g. the batch script's shell without srun's NODEID


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"SLURM_NODEID": "x"}, "SLURM_NODEID='x' is not a node index"),
        ({"SLURM_STEP_NODELIST": "gpu[01-03"}, "SLURM_STEP_NODELIST='gpu[01-03': unbalanced"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "disagree"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x4)"}, "srun started 2 tasks on node 1"),
        ({"SLURM_GPUS_ON_NODE": "many"}, "SLURM_GPUS_ON_NODE='many' is not a number"),
    ],
)
def test_bad_variables_are_usage_errors(change: dict[str, str], says: str) -> None:
    with pytest.raises(UsageError, match=says.replace("[", r"\[").replace("(", r"\(")):
        from_env(srun_env(1, **change))
    without = {k: v for k, v in srun_env(1).items() if not k.endswith("NODELIST")}
    with pytest.raises(UsageError, match="SLURM_JOB_NODELIST is not"):
        from_env(without)

"""Where a node stands in a Slurm job step (``srun nvtrain run ...``), from the variables that
``srun`` sets for each task. Pure: ``launcher.identity`` hands in the environment.

One ``nvtrain run`` per node, as ft_launcher is started on Slurm (``srun --ntasks-per-node=1``):

- node rank: ``SLURM_NODEID`` (the node's index in the step, in node-list order);
- node count: ``SLURM_STEP_NUM_NODES``, else ``SLURM_JOB_NUM_NODES``, else ``SLURM_NNODES``;
- the rendezvous store's host: the first node of ``SLURM_STEP_NODELIST``, else of
  ``SLURM_JOB_NODELIST`` (Slurm's compressed host list, ``node[01-04,07]``: :func:`expand`),
  which is node 0;
- this node's name for its peers: ``SLURMD_NODENAME`` (a name of the same node list);
- run id: ``SLURM_JOB_ID`` (a requeued job keeps it, so it resumes its own checkpoints);
- workers per node, when nothing else says: ``SLURM_GPUS_ON_NODE`` (the GPUs the step has on
  this node). Not ``SLURM_NTASKS_PER_NODE``: inside ``srun --ntasks-per-node=1`` it is the
  step's 1, whatever ``#SBATCH --ntasks-per-node`` said (seen with Slurm 22.05).

A step that starts more than one task on a node (``SLURM_STEP_TASKS_PER_NODE``, ``2(x3),1``:
:func:`tasks_per_node`) would start several launchers
there, each with its own workers: refused with the fix. The batch script itself (no ``srun``:
``SLURM_NODEID`` is set there too, but no ``SLURM_STEP_ID``) is one process on one node
(``SlurmStep.batch``): its node count is the allocation's, not the job's; ``launcher.identity``
refuses a multi-node job started there, whose other nodes would never start.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from nvtrain.errors import UsageError

__all__ = ["MAX_HOSTS", "SlurmStep", "expand", "from_env", "tasks_per_node"]

MAX_HOSTS = 100_000
"""Most hosts a node list may expand to (a typo such as ``n[1-999999999]`` is refused)."""

_ITEM = re.compile(r"[^,\[\]]*(?:\[[^\[\]]*\][^,\[\]]*)*")


def expand(hostlist: str) -> list[str]:
    """Slurm's compressed host list as names, in order: ``node[01-03,07],login1`` ->
    ``node01 node02 node03 node07 login1``. Several bracket groups in one name multiply
    (``r[1-2]n[1-2]`` -> ``r1n1 r1n2 r2n1 r2n2``); a range keeps the width of its first number
    (``[08-10]`` -> ``08 09 10``). ``ValueError`` naming the fault when it is not such a list."""
    text = hostlist.strip()
    if not text:
        raise ValueError("the node list is empty")
    hosts: list[str] = []
    pos = 0
    while pos <= len(text):
        match = _ITEM.match(text, pos)
        assert match is not None  # the pattern matches the empty string
        item = match.group(0)
        end = match.end()
        if end < len(text) and text[end] != ",":
            raise ValueError(f"unbalanced '[' or ']' at character {end + 1} of {hostlist!r}")
        if not item:
            raise ValueError(f"an empty name at character {pos + 1} of {hostlist!r}")
        hosts.extend(_expand_item(item, hostlist, MAX_HOSTS - len(hosts)))
        pos = end + 1
    return hosts


def _expand_item(item: str, hostlist: str, room: int) -> list[str]:
    names = [""]
    for literal, group in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
        names = [name + literal for name in names]
        if group:
            parts = _ranges(group, hostlist)
            if len(names) * len(parts) > room:
                raise ValueError(f"{hostlist!r} names more than {MAX_HOSTS} hosts")
            names = [name + part for name in names for part in parts]
    return names


def _ranges(group: str, hostlist: str) -> list[str]:
    out: list[str] = []
    for part in group.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise ValueError(f"[{group}] in {hostlist!r}: {part!r} is not a number or a range LOW-HIGH")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"[{group}] in {hostlist!r}: the range {part!r} runs backwards")
        if int(high) - int(low) >= MAX_HOSTS:
            raise ValueError(f"{hostlist!r} names more than {MAX_HOSTS} hosts")
        out += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return out


def tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks-per-node list, one number per node: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ValueError(f"{text!r} is not a tasks-per-node list such as 2(x3),1")
        repeat = int(match.group(2) or 1)
        if repeat > MAX_HOSTS or len(counts) + repeat > MAX_HOSTS:
            raise ValueError(f"{text!r} counts more than {MAX_HOSTS} nodes")
        counts += [int(match.group(1))] * repeat
    return counts


@dataclasses.dataclass(frozen=True)
class SlurmStep:
    """What ``srun`` tells one task of a job step."""

    job_id: str
    node_rank: int
    nodes: int
    store_host: str
    """Node 0 of the step: the first name of its node list."""
    node_name: str | None
    """This node's name in the node list (``SLURMD_NODENAME``), published to the peers."""
    nproc: int | None
    """Workers per node Slurm suggests (the step's GPUs on this node); None: nothing."""
    batch: bool = False
    """The batch script, not a task of an ``srun`` step (no ``SLURM_STEP_ID``)."""


def _number(env: Mapping[str, str], var: str) -> int | None:
    text = env.get(var, "").strip()
    if not text:
        return None
    # SLURM_GPUS_ON_NODE and SLURM_NTASKS_PER_NODE are plain numbers in a step; a list such as
    # "8(x2)" (heterogeneous nodes) counts by its first entry for this purpose.
    match = re.match(r"(\d+)", text)
    if match is None:
        raise UsageError(f"{var}={text!r} is not a number", f"unset {var}, or run under srun, which sets it")
    return int(match.group(1))


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        if env.get(name, "").strip():
            return name, env[name].strip()
    return None


def from_env(env: Mapping[str, str]) -> SlurmStep | None:
    """This task's place in its Slurm step; None when the environment is not a Slurm task's
    (no ``SLURM_JOB_ID`` and ``SLURM_NODEID``). ``UsageError`` for a value that cannot be
    read, or a step that runs more than one task on this node."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    node_id = env.get("SLURM_NODEID", "").strip()
    if not job_id or not node_id:
        return None
    fix = "run it as `srun --ntasks-per-node=1 nvtrain run ...`, which sets it"
    if not (node_id.isascii() and node_id.isdecimal()):
        raise UsageError(f"SLURM_NODEID={node_id!r} is not a node index", fix)
    rank = int(node_id)
    counted = _first(env, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    listed = _first(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if counted is None or listed is None:
        missing = "SLURM_JOB_NUM_NODES" if counted is None else "SLURM_JOB_NODELIST"
        raise UsageError(f"SLURM_JOB_ID and SLURM_NODEID are set, but {missing} is not", fix)
    if not counted[1].isdecimal() or int(counted[1]) < 1:
        raise UsageError(f"{counted[0]}={counted[1]!r} is not a number of nodes", fix)
    nodes = int(counted[1])
    try:
        hosts = expand(listed[1])
    except ValueError as exc:
        raise UsageError(f"{listed[0]}={listed[1]!r}: {exc}", fix) from None
    if len(hosts) != nodes or rank >= nodes:
        raise UsageError(
            f"Slurm's variables disagree: {counted[0]}={nodes}, {listed[0]}={listed[1]!r} "
            f"({len(hosts)} node(s)), SLURM_NODEID={rank}",
            "start nvtrain run through srun inside the allocation (not by hand with copied variables)",
        )
    per_node = _first(env, "SLURM_STEP_TASKS_PER_NODE")  # the allocation's says nothing of the step
    if per_node is not None:
        try:
            counts = tasks_per_node(per_node[1])
        except ValueError as exc:
            raise UsageError(f"{per_node[0]}: {exc}", fix) from None
        here = counts[rank] if rank < len(counts) else counts[-1]
        if here > 1:
            raise UsageError(
                f"{per_node[0]}={per_node[1]!r}: srun started {here} tasks on node {rank}, and "
                "each would be a launcher with workers of its own; nvtrain run is the one "
                "launcher of its node",
                "start one task per node: srun --ntasks-per-node=1 nvtrain run --nproc-per-node N ...",
            )
    gpus = _number(env, "SLURM_GPUS_ON_NODE")
    node_name = env.get("SLURMD_NODENAME", "").strip() or None
    batch = not env.get("SLURM_STEP_ID", "").strip()
    return SlurmStep(job_id, rank, nodes, hosts[0], node_name, gpus or None, batch)

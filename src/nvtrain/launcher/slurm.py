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

The step's size and the job's must agree (:func:`check_job_size`): a policy or ``--nnodes``
that asks for other than the step's node count (a one-node policy under ``srun -N2``, whose
tasks would each run as node 0 of a job of their own under one run id, events log and step
folders) is refused with exit 2 on every node of the step, never run as another job.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from nvtrain.errors import UsageError

if TYPE_CHECKING:
    from nvtrain.config.schema import Policy

__all__ = ["MAX_HOSTS", "SlurmStep", "check_job_size", "expand", "from_env", "tasks_per_node"]

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
    nodes_from: str = dataclasses.field(default="SLURM_STEP_NUM_NODES", compare=False)
    """The variable that gave ``nodes``, for messages (not part of the step's identity)."""


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
    return SlurmStep(job_id, rank, nodes, hosts[0], node_name, gpus or None, batch, counted[0])


def check_job_size(step: SlurmStep, policy: Policy, *, flag: str | None, policy_file: Path | None) -> None:
    """``UsageError`` when the job's node count (``[rendezvous] nodes`` and ``min_nodes``, as
    resolved) does not fit this ``srun`` step: more nodes than the job takes (a one-node job on
    every node of the step: each task would be node 0 of a job of its own, under the run id
    they share), or fewer than it needs (it would wait for nodes the step never starts). An
    elastic job (``min_nodes`` < ``nodes``) fits a step of any size in between. ``flag``: the
    command-line flag that set the count (``--nnodes 1``, ``--standalone``), else None (the
    policy file ``policy_file``, or the default). The batch script is one process on one node
    (``launcher.identity`` refuses a multi-node job there)."""
    nodes, low = policy.rendezvous.nodes, policy.min_nodes
    if step.batch or low <= step.nodes <= nodes:
        return
    size = f"{nodes} node(s)" if low == nodes else f"{low} to {nodes} nodes"
    key = "nodes" if step.nodes > nodes or low == nodes else "min_nodes"
    written = _written_key(policy, policy_file)
    asked = flag or written or f"[rendezvous] nodes = {nodes} (the default)"
    if nodes == 1:
        harm = (
            "each task of the step would run as node 0 of a one-node job of its own, and they "
            "would share one run id, events log and step folders"
        )
    elif step.nodes > nodes:
        harm = f"nodes {nodes} to {step.nodes - 1} of the step would have no place in the job"
    else:
        harm = f"the job would wait for {low - step.nodes} more node(s), which this step never starts"
    if flag is not None:
        match = f"pass --nnodes {step.nodes} instead of {flag}"
    elif written is not None:
        match = (
            f"set [rendezvous] {key} = {step.nodes} in {policy_file} (or leave the job's size out "
            "of the policy: under srun it is the step's node count)"
        )
    else:
        match = f"pass --nnodes {step.nodes}"
    raise UsageError(
        f"the Slurm step has {step.nodes} node(s) ({step.nodes_from}={step.nodes}, "
        f"SLURM_NODEID={step.node_rank}, SLURM_JOB_ID={step.job_id}), but {asked} asks for "
        f"{size}: {harm}; nvtrain run does not start it as another job",
        f"make them agree: {match}; or start the step on {nodes} node(s): srun -N{nodes} "
        "--ntasks-per-node=1 nvtrain run ...",
    )


def _written_key(policy: Policy, policy_file: Path | None) -> str | None:
    """``[rendezvous] nodes = N in FILE:LINE`` (or ``min_nodes``) when the policy file writes the
    job's size; None when it does not (the default, or what a flag or Slurm set)."""
    r = policy.rendezvous
    written = [
        k
        for k in ("nodes", "min_nodes")
        if k in r.model_fields_set and f"rendezvous.{k}" not in policy.derived
    ]
    if policy_file is None or not written:
        return None
    key = written[0]
    where = str(policy_file)
    try:
        from nvtrain.config.locate import key_positions

        found = key_positions(policy_file.read_text(encoding="utf-8")).get(("rendezvous", key))
    except (OSError, UnicodeDecodeError):
        found = None
    if found is not None:
        where += f":{found[0]}"
    return f"[rendezvous] {key} = {getattr(r, key)} in {where}"

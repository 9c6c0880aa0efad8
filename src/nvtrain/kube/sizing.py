"""How big each training pod is: GPUs and other devices, ranks, CPU and memory, ``/dev/shm`` and
the host copies of the checkpoint, and the notes that say what could not be sized.

The one source of the sizes that ``nvtrain manifest`` renders and that its checks compare with:
GPUs per pod from ``[job] nproc_per_node`` or ``--gpus``; the memory-backed volumes (``/dev/shm``
and the host copies that ``[checkpoint] memory_dir`` keeps, ``host_copies_per_rank`` ×
``--state-per-rank`` × the ranks of a pod); the container's requests and limits through ``qos``.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import PurePosixPath
from typing import Any

from nvtrain.config.checks import MAX_NPROC
from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.kube import qos
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.quantity import format_bytes as _quantity
from nvtrain.kube.quantity import parse_quantity as _check_quantity

__all__ = [
    "EFA_RESOURCE",
    "GPU_RESOURCE",
    "HOST_COPY_SLOTS",
    "PEER_COPY_SLOTS",
    "SHM_MOUNT",
    "gpus",
    "host_copies_made_of",
    "host_copies_per_rank",
    "host_copy_bytes",
    "host_copy_volume_size",
    "in_shm",
    "keeps_host_copy",
    "known_ranks",
    "notes",
    "ranks_per_pod",
    "sends_peer_copy",
    "shm_size_limit",
    "training_resources",
]


SHM_MOUNT = "/dev/shm"

GPU_RESOURCE = "nvidia.com/gpu"

EFA_RESOURCE = "vpc.amazonaws.com/efa"

HOST_COPY_SLOTS = 2
"""Copies of its checkpoint state that each rank keeps in ``[checkpoint] memory_dir``: the
newest committed one stays whole while the next save is staged into the other slot."""

PEER_COPY_SLOTS = 1
"""Copies of another rank's state that each rank keeps in ``memory_dir`` with ``[checkpoint]
peer_copy``: the sealed host copy of the rank with the same local rank on the previous pod."""


def gpus(policy: Policy, options: ManifestOptions) -> int:
    """GPUs per pod: given, or one per worker process (none for gloo or "cpu")."""
    nproc, backend = policy.job.nproc_per_node, policy.job.backend
    if options.gpus_per_node is not None:
        count = options.gpus_per_node
        if count < 0:
            raise UsageError(f"--gpus {count} is negative", "give 0 or more GPUs per pod")
        if count > MAX_NPROC:
            raise UsageError(
                f"--gpus {count} is more GPUs than a pod can have (at most {MAX_NPROC})",
                "give the GPUs of one node, e.g. --gpus 8",
            )
        if isinstance(nproc, int) and count > 0 and count != nproc:
            raise UsageError(
                f"--gpus {count} disagrees with [job] nproc_per_node = {nproc}: each worker "
                "process uses one GPU",
                f'use --gpus {nproc}, or change nproc_per_node to {count} (or to "gpu")',
            )
        return count
    if backend == "gloo" or nproc == "cpu":
        return 0
    if nproc == "gpu":
        raise UsageError(
            '[job] nproc_per_node = "gpu" does not say how many GPUs each pod needs',
            "pass --gpus N (the GPUs of one node), or set nproc_per_node to a number",
        )
    assert isinstance(nproc, int)
    return nproc


def keeps_host_copy(policy: Policy) -> bool:
    """Whether ``nvtrain run`` keeps each rank's staged checkpoint in ``[checkpoint]
    memory_dir``: with ``async`` and ``in_memory`` on and ``memory_dir`` not ``""``."""
    c = policy.checkpoint
    return c.async_ and c.in_memory and bool(c.memory_dir)


def sends_peer_copy(policy: Policy) -> bool:
    """Whether each rank also keeps a peer's host copy (``[checkpoint] peer_copy``): with the
    host copy kept and more than one pod, so that there is a next pod to send it to."""
    return keeps_host_copy(policy) and policy.checkpoint.peer_copy and policy.rendezvous.nodes > 1


def host_copies_per_rank(policy: Policy) -> int:
    """Copies of a rank's checkpoint state that ``[checkpoint] memory_dir`` holds per rank of a
    pod: ``HOST_COPY_SLOTS`` of its own, plus ``PEER_COPY_SLOTS`` with the peer copy
    (``sends_peer_copy``); 0 when the policy keeps no host copy. The one source of the sizes."""
    if not keeps_host_copy(policy):
        return 0
    return HOST_COPY_SLOTS + (PEER_COPY_SLOTS if sends_peer_copy(policy) else 0)


def host_copies_made_of(policy: Policy) -> str:
    """What ``host_copies_per_rank`` counts, in words, for the notes and errors."""
    own = f"{HOST_COPY_SLOTS} slots of its own"
    if sends_peer_copy(policy):
        return f"{own} + {PEER_COPY_SLOTS} peer copy of the same local rank on the previous pod"
    return own


def known_ranks(policy: Policy, options: ManifestOptions) -> int | None:
    """Ranks of one pod when the policy (or ``--gpus`` with ``"gpu"``) says; None with ``"cpu"``."""
    nproc = policy.job.nproc_per_node
    if isinstance(nproc, int):
        return nproc
    if nproc == "gpu" and options.gpus_per_node:
        return options.gpus_per_node
    return None


def ranks_per_pod(policy: Policy, options: ManifestOptions) -> int:
    """Worker processes (ranks) of one pod: ``[job] nproc_per_node``, or with ``"gpu"`` the
    GPUs of the pod (``--gpus``). ``"cpu"`` (one per CPU core of the node) cannot be known."""
    nproc = policy.job.nproc_per_node
    if nproc == "gpu":
        gpus(policy, options)  # the usual error without --gpus, and its range checks
    ranks = known_ranks(policy, options)
    if ranks is not None:
        return ranks
    if nproc == "gpu":
        raise UsageError(
            '[job] nproc_per_node = "gpu" with no GPUs per pod does not say how many ranks a pod '
            "runs, so --state-per-rank cannot size the host copies",
            "pass --gpus N (the GPUs of one node), or set nproc_per_node to a number",
        )
    raise UsageError(
        '[job] nproc_per_node = "cpu" (one rank per CPU core of the node) does not say how many '
        "ranks a pod runs, so --state-per-rank cannot size the host copies",
        "set nproc_per_node to the number of ranks of one pod, or leave out --state-per-rank "
        "(and size the memory yourself)",
    )


def _state_bytes(options: ManifestOptions) -> Fraction | None:
    if options.state_per_rank is None:
        return None
    state = _check_quantity("--state-per-rank", options.state_per_rank)
    if state <= 0:
        raise UsageError(
            f"--state-per-rank {options.state_per_rank!r} is not a size",
            'give the checkpoint state (model + optimizer) of one rank, e.g. "20Gi"',
        )
    return state


def host_copy_bytes(policy: Policy, options: ManifestOptions) -> Fraction | None:
    """Memory the host copies of one pod take: ``host_copies_per_rank`` × ``--state-per-rank`` ×
    ``ranks_per_pod``; None without ``--state-per-rank`` or when the policy keeps no copy."""
    state = _state_bytes(options)
    copies = host_copies_per_rank(policy)
    if state is None or not copies:
        return None
    return copies * state * ranks_per_pod(policy, options)


def in_shm(directory: str) -> bool:
    """Whether ``directory`` is ``/dev/shm`` or in it."""
    path, shm = PurePosixPath(directory), PurePosixPath(SHM_MOUNT)
    return path == shm or shm in path.parents


def shm_size_limit(policy: Policy, options: ManifestOptions) -> str:
    """``sizeLimit`` of ``/dev/shm``: ``--shm-size``, plus the host copies when they live there."""
    host = host_copy_bytes(policy, options)
    if host is None or not in_shm(policy.checkpoint.memory_dir):
        return options.shm_size
    return _quantity(_check_quantity("--shm-size", options.shm_size) + host)


def host_copy_volume_size(policy: Policy, options: ManifestOptions) -> str | None:
    """``sizeLimit`` of the emptyDir mounted at a ``memory_dir`` outside ``/dev/shm``, or None
    when there is none (no copy, ``memory_dir`` in ``/dev/shm``, or no ``--state-per-rank``)."""
    host = host_copy_bytes(policy, options)
    if host is None or in_shm(policy.checkpoint.memory_dir):
        return None
    return _quantity(host)


def training_resources(policy: Policy, options: ManifestOptions) -> dict[str, Any]:
    """The training container's ``resources``: GPUs, EFA and other extended resources, and
    CPU and memory (``qos``), the memory-backed volumes counted in."""
    extended: dict[str, int] = {}
    count = gpus(policy, options)
    if count:
        extended[GPU_RESOURCE] = count
    if options.efa:
        extended[EFA_RESOURCE] = options.efa
    extended.update(options.resources)
    extended.update(options.rdma_resources)
    # Every medium: Memory volume counts against the memory limit: /dev/shm and the host copies
    # (in /dev/shm or in a volume of their own, the same bytes either way).
    memory_backed = _check_quantity("--shm-size", options.shm_size) + (host_copy_bytes(policy, options) or 0)
    return qos.training_resources(
        extended=extended,
        ranks=known_ranks(policy, options),
        memory_backed=memory_backed,
        cpu=options.cpu,
        memory=options.memory,
        qos=options.qos,
    )


def notes(policy: Policy, options: ManifestOptions) -> list[str]:
    """What the user should know about the memory of the pods (``nvtrain manifest`` prints each
    on stderr): the host copies are kept but not sized (no ``--state-per-rank``), or
    ``--state-per-rank`` is given for a policy that keeps none; CPU or memory is not requested
    because the ranks of a pod are not known. Call after ``render``."""
    found = _host_copy_notes(policy, options)
    given = {"--cpu": ("CPU", options.cpu), "--memory": ("memory", options.memory)}
    missing = [flag for flag, (_, value) in given.items() if value is None]
    if known_ranks(policy, options) is None and missing:
        found.append(
            f'[job] nproc_per_node = "{policy.job.nproc_per_node}" does not say how many ranks a pod '
            f"runs, so no {' and no '.join(given[f][0] for f in missing)} "
            "is requested by default: the pods may be evicted first, and nothing reserves the memory "
            f"of /dev/shm; pass {' and '.join(missing)}"
        )
    return found


def _host_copy_notes(policy: Policy, options: ManifestOptions) -> list[str]:
    """The notes on the host copies of the checkpoint (see ``notes``)."""
    c = policy.checkpoint
    if not keeps_host_copy(policy):
        if options.state_per_rank is None:
            return []
        reason = (
            "async = false" if not c.async_ else "in_memory = false" if not c.in_memory else 'memory_dir = ""'
        )
        return [
            f"--state-per-rank changes nothing: the policy keeps no host copy of the checkpoint "
            f"([checkpoint] {reason})"
        ]
    if options.state_per_rank is not None:
        return []
    ranks = known_ranks(policy, options)
    per_rank = f"{host_copies_per_rank(policy)} × state per rank"
    per_pod = (
        f"{per_rank} × {ranks} ranks per pod" if ranks is not None else f"{per_rank}, each rank of a pod"
    )
    where = (
        f"[checkpoint] memory_dir {c.memory_dir!r} holds the host copies of the checkpoint, {per_pod} "
        f"(per rank {host_copies_made_of(policy)})"
    )
    size_it = "pass --state-per-rank QUANTITY (one rank's model + optimizer state)"
    if in_shm(c.memory_dir):
        return [
            f"{where}; /dev/shm is sized {options.shm_size} (--shm-size) without them: {size_it} to size it"
        ]
    return [f"{where}; no memory-backed volume is mounted there: {size_it} to mount one"]

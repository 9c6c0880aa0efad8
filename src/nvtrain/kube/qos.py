"""CPU and memory of the pods, and their Kubernetes QoS class (``--qos``).

A pod that requests no CPU and no memory is *BestEffort*: the kubelet evicts it first when a
node runs short of memory, and the kernel OOM-kills it first. A training pod must not be that,
so ``nvtrain manifest`` requests CPU and memory by default, sized from the ranks of a pod:

- CPU: ``CPU_PER_RANK`` cores per rank (data-loader workers, the rank's own thread, NCCL's
  proxy threads);
- memory: ``MEMORY_PER_RANK`` per rank, plus every memory-backed volume of the pod (``/dev/shm``
  and the host copies of the checkpoint), since a ``medium: Memory`` emptyDir is charged to the
  container's memory and so counts against its limit.

The memory limit equals the request, as it did with ``--memory``: a pod is never killed for
using memory it asked for. ``--cpu`` and ``--memory`` replace the default of their resource.

``--qos burstable`` (the default) sets no CPU limit: a throttled rank slows every collective of
the job. ``--qos guaranteed`` sets every limit equal to its request (CPU, memory and the extended
resources, which always are), so the pod is in the *Guaranteed* class: the last to be evicted,
and with the kubelet's static CPU manager policy and a whole number of CPUs, given CPUs of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from nvtrain.errors import UsageError
from nvtrain.kube.quantity import format_bytes, format_cpu

__all__ = [
    "CONTROL_GUARANTEED",
    "CPU_PER_RANK",
    "MEMORY_PER_RANK",
    "QOS_CLASSES",
    "check_qos",
    "control_resources",
    "default_cpu",
    "default_memory",
    "training_resources",
]

QOS_CLASSES = ("burstable", "guaranteed")
"""Values of ``--qos``."""

CPU_PER_RANK = Fraction(2)
"""CPU cores requested per rank by default. Small enough for a 1-GPU cloud node of 4 vCPUs; a
burstable pod may use more when the node has them, a guaranteed one may not (give ``--cpu``)."""

MEMORY_PER_RANK = Fraction(16 * 2**30)
"""Memory requested per rank by default (16Gi), besides the memory-backed volumes: the rank's
process with PyTorch and CUDA, its data-loader workers, its share of the launcher and monitors."""

CONTROL_GUARANTEED = {"cpu": "1", "memory": "2Gi"}
"""The control pod's requests and limits with ``--qos guaranteed``: a whole CPU, so that the
limit rarely throttles the store, and the 2Gi that caps it in the burstable form."""


def check_qos(qos: str) -> None:
    """``--qos`` must be one of ``QOS_CLASSES``."""
    if qos not in QOS_CLASSES:
        raise UsageError(
            f"--qos {qos!r} is not a QoS class nvtrain renders",
            f"use --qos {' or --qos '.join(QOS_CLASSES)}",
        )


def default_cpu(ranks: int) -> str:
    """CPU request of a pod of ``ranks`` ranks without ``--cpu``."""
    return format_cpu(CPU_PER_RANK * ranks)


def default_memory(ranks: int, memory_backed: Fraction) -> str:
    """Memory request (and limit) of a pod without ``--memory``: ``MEMORY_PER_RANK`` per rank
    plus ``memory_backed`` bytes of ``medium: Memory`` volumes."""
    return format_bytes(MEMORY_PER_RANK * ranks + memory_backed)


def training_resources(
    *,
    extended: Mapping[str, int],
    ranks: int | None,
    memory_backed: Fraction,
    cpu: str | None,
    memory: str | None,
    qos: str,
) -> dict[str, Any]:
    """``resources`` of the training container: ``extended`` (GPUs, EFA, RDMA) as requests =
    limits, CPU and memory from ``cpu`` and ``memory`` or, unset, from the ranks of the pod
    (``ranks`` None: not known, as with ``nproc_per_node = "cpu"``, and no default)."""
    if cpu is None and ranks is not None:
        cpu = default_cpu(ranks)
    if memory is None and ranks is not None:
        memory = default_memory(ranks, memory_backed)
    if qos == "guaranteed" and (cpu is None or memory is None):
        raise UsageError(
            '--qos guaranteed needs a CPU and a memory limit, and with [job] nproc_per_node = "cpu" '
            "the ranks of a pod, and so the defaults, are not known",
            "pass --cpu and --memory (e.g. --cpu 32 --memory 256Gi), or set nproc_per_node to a number",
        )
    requests: dict[str, Any] = dict(extended)
    limits: dict[str, Any] = dict(extended)
    if cpu is not None:
        requests["cpu"] = cpu
        if qos == "guaranteed":
            limits["cpu"] = cpu
    if memory is not None:
        requests["memory"] = limits["memory"] = memory
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources


def control_resources(qos: str, burstable: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    """``resources`` of the control pod: ``burstable`` (no CPU limit: a throttled store delays
    every launcher), or ``CONTROL_GUARANTEED`` as requests and limits with ``--qos guaranteed``."""
    if qos == "guaranteed":
        return {"requests": dict(CONTROL_GUARANTEED), "limits": dict(CONTROL_GUARANTEED)}
    return {kind: dict(values) for kind, values in burstable.items()}

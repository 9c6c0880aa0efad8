"""``[checkpoint]``: folders the workers can use wherever they start, a retention that keeps the
last complete checkpoint, and keys that have no effect with the others."""

from __future__ import annotations

from collections.abc import Iterator

from nvtrain.config.checks_base import finding as _f
from nvtrain.config.checks_base import suggest_label
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding

__all__ = ["checkpoint"]


def checkpoint(p: Policy) -> Iterator[Finding]:
    """``[checkpoint]``: its folders, what async saves need, keys with no effect."""
    c = p.checkpoint
    if "\0" in c.dir:
        yield _f(
            "error",
            "checkpoint-dir",
            "checkpoint",
            "dir",
            c.dir,
            "contains a NUL character, which no path can hold",
            f'e.g. dir = "/checkpoints/{suggest_label(p.job.name)}"',
        )
    elif not c.dir.startswith("/"):
        yield _f(
            "error",
            "checkpoint-dir",
            "checkpoint",
            "dir",
            c.dir,
            "must be an absolute path (workers may start in another directory)",
            f'e.g. dir = "/checkpoints/{suggest_label(p.job.name)}"',
        )
    if c.memory_dir and (not c.memory_dir.startswith("/") or "\0" in c.memory_dir):
        yield _f(
            "error",
            "checkpoint-memory-dir",
            "checkpoint",
            "memory_dir",
            c.memory_dir,
            "must be an absolute path (a memory-backed folder such as /dev/shm), or empty",
            'use memory_dir = "/dev/shm", or memory_dir = "" to keep the copy in the worker only',
        )
    if c.async_ and c.keep < 2:
        yield _f(
            "error",
            "checkpoint-keep",
            "checkpoint",
            "keep",
            c.keep,
            "must be >= 2 with async saves: the last complete checkpoint must survive "
            "while the next one is written",
            "use keep = 2 or more, or async = false",
        )
    if c.peer_copy and "peer_copy" in c.model_fields_set and not (c.async_ and c.in_memory and c.memory_dir):
        # Written out (the default is quiet): the peer copy sends the host copy, which is off.
        host_copy_off = (
            "async = false" if not c.async_ else "in_memory = false" if not c.in_memory else 'memory_dir = ""'
        )
        yield _f(
            "warning",
            "no-effect",
            "checkpoint",
            "peer_copy",
            c.peer_copy,
            f"has no effect: it sends each rank's host copy to the next pod, and this policy keeps "
            f"no host copy ({host_copy_off})",
            "remove peer_copy or set peer_copy = false, or keep the host copy (async = true, "
            'in_memory = true, memory_dir = "/dev/shm")',
        )
    steps = p.job.max_steps
    if steps is not None and c.interval > steps:
        yield _f(
            "warning",
            "checkpoint-never",
            "checkpoint",
            "interval",
            c.interval,
            f"is longer than the run ([job] max_steps = {steps}): no checkpoint is written",
            f"use an interval below {steps}",
        )

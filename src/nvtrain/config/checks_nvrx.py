"""Rules that depend on the NVRx version the job runs (``nvtrain validate --nvrx``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from nvtrain.config.checks_base import finding as _f
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding

if TYPE_CHECKING:
    from nvtrain.nvrx import NvrxVersion

__all__ = ["LARGE_JOB_NODES", "nvrx_rules"]


LARGE_JOB_NODES = 1000
"""From this many nodes NVRx 0.4's rendezvous store is near what it can take (measured and
worked out in docs/architecture.md, "At 1,000+ nodes")."""


def nvrx_rules(p: Policy, v: NvrxVersion) -> Iterator[Finding]:
    """What the NVRx version ``v`` does not have, or does differently, for this policy."""
    if not v.tested:
        yield _f(
            "warning",
            "nvrx-untested",
            "",
            None,
            None,
            f"NVRx {v} is not a version nvtrain is tested with (0.4, 0.6, 0.7)",
            "install nvidia-resiliency-ext 0.4.1, 0.6.x or 0.7.x, or pass --nvrx",
        )
    policy = p.restart.in_job.policy
    if policy == "min-healthy" and not v.supports_min_healthy:
        yield _f(
            "error",
            "nvrx-option",
            "restart.in_job",
            "policy",
            policy,
            f"NVRx {v} has no min-healthy restart policy (removed in 0.6)",
            'use policy = "any-failed"',
        )
    if p.restart.in_process.enabled and v.inprocess_deprecated:
        yield _f(
            "info",
            "nvrx-inprocess",
            "restart.in_process",
            "enabled",
            True,
            f"in-process restart is deprecated in NVRx {v.line}; it still handles faults "
            "that kill no process (exceptions, detected hangs)",
            "keep it for fast recovery from soft faults, or set enabled = false",
        )
    r = p.rendezvous
    if r.store == "control" and not v.has_control_plane:
        yield _f(
            "error",
            "nvrx-option",
            "rendezvous",
            "store",
            r.store,
            f"NVRx {v} has no control-plane process (nvrx-control arrived in 0.6)",
            'use store = "pod0" with NVRx 0.4 (the other pods restart their launchers when pod 0 '
            "is replaced), or install NVRx 0.6 or later",
        )
    if r.nodes >= LARGE_JOB_NODES and not v.barrier_rendezvous:
        yield _f(
            "warning",
            "nvrx-scale",
            "rendezvous",
            "nodes",
            r.nodes,
            f"NVRx {v.line}'s rendezvous keeps every node's state in one store key that each node "
            f"rewrites every 5 s; from about {LARGE_JOB_NODES:,} nodes the rewrites collide faster than "
            "they succeed, nodes miss their keep-alives and are dropped as dead (docs/architecture.md)",
            "run NVRx 0.6 or later (barrier rendezvous) for jobs this large",
        )
    if r.min_nodes is not None and r.min_nodes < r.nodes:
        if v.barrier_rendezvous:
            rule = (
                f"with NVRx {v.line} the job trains on a fixed {r.min_nodes} nodes; the other "
                f"{r.nodes - r.min_nodes} wait as hot spares and replace failed nodes"
            )
        else:
            rule = (
                f"with NVRx {v.line} the job starts on {r.nodes} nodes and shrinks, down "
                f"to {r.min_nodes}, when nodes are lost"
            )
        yield _f(
            "info",
            "nvrx-elastic",
            "rendezvous",
            "min_nodes",
            r.min_nodes,
            rule,
            "set min_nodes = nodes for a fixed-size job",
        )

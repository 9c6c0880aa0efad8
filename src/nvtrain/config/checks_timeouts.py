"""The timeout order (``timeouts.ORDER``) checked on a policy: one finding a broken rule.

The rules, their codes and texts are data in ``timeouts.py``; this module reads the policy's
values for them and says which rules apply (in-process restart on, the backend as ``nvtrain
validate`` sees it, more than one rank) and which are broken.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel

from nvtrain.config.checks_base import finding
from nvtrain.config.schema import Policy
from nvtrain.config.timeouts import ORDER, Key, Order
from nvtrain.findings import Finding

__all__ = ["order", "validated_backend"]


def validated_backend(p: Policy) -> str:
    """The backend the rules take: ``"auto"`` is gloo for CPU jobs, NCCL otherwise (what the
    workers pick on a GPU node; ``checks_backend.py`` warns about the other case)."""
    if p.job.backend == "auto":
        return "gloo" if p.job.nproc_per_node == "cpu" else "nccl"
    return p.job.backend


def _value(p: Policy, key: Key | float) -> float | None:
    """The seconds of ``key`` in ``p`` (None when unset, or not a fixed duration)."""
    if isinstance(key, float):
        return key
    node: object = p
    for part in key.split("."):
        node = getattr(node, part) if isinstance(node, BaseModel) else None
    return node if isinstance(node, float) else None


def _applies(o: Order, p: Policy) -> bool:
    if o.in_process and not p.restart.in_process.enabled:
        return False
    if o.backend is not None and validated_backend(p) != o.backend:
        return False
    ranks = p.world_size()
    return not (o.ranks and ranks is not None and ranks <= 1)


def order(p: Policy, *, in_process: bool) -> Iterator[Finding]:
    """A finding for each broken rule of the order: the in-process layer's, or the others."""
    by_name = {o.name: o for o in ORDER}
    for o in ORDER:
        if o.in_process != in_process or not _broken(o, p):
            continue
        if o.unless is not None and _broken(by_name[o.unless], p):
            continue  # the rule it names is broken too, and says enough
        lower, upper = _value(p, o.lower), _value(p, o.upper)
        assert lower is not None and upper is not None  # a broken rule has both
        key, shown = (o.lower, lower) if o.subject == "lower" else (str(o.upper), upper)
        table, _, name = key.rpartition(".")
        rule, fix = o.text(o.rule, lower, upper), o.text(o.fix, lower, upper)
        yield finding(o.severity, o.code, table, name, shown, rule, fix)


def _broken(o: Order, p: Policy) -> bool:
    """Whether rule ``o`` applies to ``p`` and does not hold."""
    if not _applies(o, p):
        return False
    lower, upper = _value(p, o.lower), _value(p, o.upper)
    return lower is not None and upper is not None and not o.holds(lower, upper)

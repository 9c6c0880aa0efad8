"""Rules that relate several keys of a valid policy, returned as findings (never raised).

Each rule is a small function that yields findings; ``check`` runs them all so that
``nvtrain validate`` shows every problem at once. Findings carry table and key but no line:
the caller places them in the file.

The rules live here and, by concern, in ``checks_names.py`` (Kubernetes names),
``checks_heartbeat.py``, ``checks_timeouts.py`` (the timeout order of ``timeouts.py``),
``checks_backend.py`` (``backend = "auto"``), ``checks_checkpoint.py``, ``checks_nvrx.py``
(per NVRx version) and ``checks_timings.py`` (against measured timings).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from nvtrain.config.checks_backend import auto_backend
from nvtrain.config.checks_base import duration as _d
from nvtrain.config.checks_base import finding as _f
from nvtrain.config.checks_checkpoint import checkpoint
from nvtrain.config.checks_heartbeat import heartbeat
from nvtrain.config.checks_names import names
from nvtrain.config.checks_nvrx import LARGE_JOB_NODES, nvrx_rules
from nvtrain.config.checks_timeouts import order
from nvtrain.config.checks_timings import MARGIN, timing_rules
from nvtrain.config.derive import MAX_DURATION
from nvtrain.config.duration import is_duration_field
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding

if TYPE_CHECKING:
    from nvtrain.config.timings import Timings
    from nvtrain.nvrx import NvrxVersion

__all__ = ["LARGE_JOB_NODES", "MARGIN", "MAX_DURATION", "MAX_NODES", "MAX_NPROC", "check"]

MAX_NPROC = 1024
"""Most worker processes per node (``[job] nproc_per_node``): far beyond the GPUs or cores of a node."""

MAX_NODES = 100_000
"""Most nodes (``[rendezvous] nodes``): Kubernetes' limit on an Indexed Job's completions."""

Rule = Callable[[Policy], Iterator[Finding]]


def check(
    policy: Policy,
    *,
    nvrx: NvrxVersion | None = None,
    timings: Timings | None = None,
) -> list[Finding]:
    """Every cross-field finding for ``policy`` (NVRx- and timings-specific ones when given)."""
    findings: list[Finding] = []
    for rule in _RULES:
        findings.extend(rule(policy))
    if nvrx is not None:
        findings.extend(nvrx_rules(policy, nvrx))
    if timings is not None:
        findings.extend(timing_rules(policy, timings))
    return [_on_derived(f, policy.derived) for f in findings]


def _on_derived(finding: Finding, derived: typing.Mapping[str, str]) -> Finding:
    """Say so when a finding's key is not set but derived: its default follows other keys, and
    no value of it satisfies them all (``derive.py``)."""
    follows = derived.get(f"{finding.table}.{finding.key}")
    if follows is None:
        return finding
    return dataclasses.replace(
        finding,
        rule=f"{finding.rule} (the policy does not set it: its default follows {follows}, "
        "and no value satisfies every rule)",
        fix=f"{finding.fix}; or set it explicitly",
    )


def _job(p: Policy) -> Iterator[Finding]:
    job = p.job
    if (job.script is None) == (job.module is None):
        both = job.script is not None
        yield _f(
            "error",
            "job-entrypoint",
            "job",
            "module" if both else "script",
            job.module if both else None,
            "give exactly one of `script` and `module`" + (" (both are set)" if both else ""),
            'e.g. script = "train.py", or module = "mypkg.train"',
        )
    for key, value in (("script", job.script), ("module", job.module)):
        if value is not None:
            yield from _entrypoint(key, value)
    for i, arg in enumerate(job.args):
        if "\0" in arg:
            yield _f(
                "error",
                "job-args",
                "job",
                "args",
                arg,
                f"element {i + 1} contains a NUL character, which no command line can hold",
                "remove the NUL character (written \\u0000) from the argument",
            )
    if isinstance(job.nproc_per_node, int) and job.nproc_per_node < 1:
        yield _f(
            "error",
            "nproc",
            "job",
            "nproc_per_node",
            job.nproc_per_node,
            "must be >= 1",
            'use a positive number, "gpu" or "cpu"',
        )
    elif isinstance(job.nproc_per_node, int) and job.nproc_per_node > MAX_NPROC:
        yield _f(
            "error",
            "size-limit",
            "job",
            "nproc_per_node",
            job.nproc_per_node,
            f"must be <= {MAX_NPROC}: worker processes per node, one per GPU or CPU core",
            'give the workers of one node, e.g. nproc_per_node = 8, or "gpu"',
        )


def _entrypoint(key: str, value: str) -> Iterator[Finding]:
    """``[job] script`` or ``module``: it becomes one word of ft_launcher's command line, after
    the launcher's own options."""
    example = 'script = "train.py"' if key == "script" else 'module = "mypkg.train"'
    rule = fix = ""
    if not value.strip():
        rule, fix = "must not be empty", f"e.g. {example}"
    elif "\0" in value:
        rule = "contains a NUL character, which no command line can hold"
        fix = f"remove the NUL character (written \\u0000), e.g. {example}"
    elif value.startswith("-"):
        rule = (
            "starts with '-': ft_launcher would read it as an option of its own (it may override "
            "the policy's settings), not as the training " + ("script" if key == "script" else "module")
        )
        fix = f'write a path such as script = "./{value}"' if key == "script" else f"e.g. {example}"
    elif key == "module" and not all(part.isidentifier() for part in value.split(".")):
        rule = (
            "must be a Python module name, as `python -m` takes: identifiers separated by dots "
            "(not a path, and no code)"
        )
        fix = f'name the module, e.g. {example}; a file is [job] script (script = "path/to/train.py")'
    if rule:
        yield _f("error", "job-entrypoint", "job", key, value, rule, fix)


def _sizes(p: Policy) -> Iterator[Finding]:
    r = p.rendezvous
    if r.store == "control" and r.nodes == 1:
        yield _f(
            "warning",
            "store-standalone",
            "rendezvous",
            "store",
            r.store,
            "a one-node job runs standalone on localhost: there is no store to move to a control pod",
            'remove store, or set store = "pod0"; "control" matters from 2 nodes on',
        )
    if r.min_nodes is not None and r.min_nodes > r.nodes:
        yield _f(
            "error",
            "min-nodes",
            "rendezvous",
            "min_nodes",
            r.min_nodes,
            f"must be <= nodes ({r.nodes})",
            f"lower min_nodes to at most {r.nodes}, or raise nodes",
        )
    if r.nodes > MAX_NODES:
        yield _f(
            "error",
            "size-limit",
            "rendezvous",
            "nodes",
            r.nodes,
            f"must be <= {MAX_NODES:,}: Kubernetes runs at most {MAX_NODES:,} pods in an Indexed Job "
            "(its completions and parallelism)",
            "give the number of nodes (pods) the job runs on, e.g. nodes = 4",
        )
    world = p.world_size()
    ip = p.restart.in_process
    if ip.enabled and world is not None and world >= 1 and ip.min_world_size and ip.min_world_size > world:
        yield _f(
            "error",
            "min-world-size",
            "restart.in_process",
            "min_world_size",
            ip.min_world_size,
            f"must be <= nodes x nproc_per_node = {r.nodes} x {p.job.nproc_per_node} = {world}",
            f"use at most {world}",
        )


def _in_process(p: Policy) -> Iterator[Finding]:
    """The order of the in-process timeouts and the collective timeout (``timeouts.ORDER``)."""
    yield from order(p, in_process=True)


def _recovery(p: Policy) -> Iterator[Finding]:
    r = p.restart
    if not r.in_process.enabled and r.in_job.max_restarts == 0:
        yield _f(
            "warning",
            "no-recovery",
            "restart.in_job",
            "max_restarts",
            0,
            "in-process restart is off and in-job restarts are 0: every fault ends the job",
            "allow a few restarts, e.g. max_restarts = 3",
        )
    if (
        not r.in_process.enabled
        and r.in_job.max_restarts > 0
        and (r.escalate_after > r.in_job.max_restarts + 1)
    ):
        yield _f(
            "warning",
            "no-effect",
            "restart",
            "escalate_after",
            r.escalate_after,
            f"has no effect: the in-job budget ({r.in_job.max_restarts} restart"
            f"{'s' if r.in_job.max_restarts != 1 else ''}) ends the "
            "job before the same fault can repeat this often",
            f"use at most {r.in_job.max_restarts + 1}, or raise [restart.in_job] max_restarts",
        )


def _durations(p: Policy) -> Iterator[Finding]:
    """Every duration key: at most ``MAX_DURATION`` (timers and the pods' grace period)."""
    for table, model in _tables(p):
        for name, info in type(model).model_fields.items():
            value = getattr(model, name)
            if _is_duration(info) and isinstance(value, float) and value > MAX_DURATION:
                yield _f(
                    "error",
                    "duration-limit",
                    table,
                    info.alias or name,
                    value,
                    f"is longer than {_d(MAX_DURATION)} (a year): no wait of the job is meant to "
                    "last that long, and timers and Kubernetes' termination grace period "
                    "(derived from [job] stop_timeout) cannot hold arbitrary durations",
                    f'use at most "{_d(MAX_DURATION)}"; durations are seconds unless a unit is '
                    'written, e.g. "90s", "15m", "2h"',
                )


def _is_duration(info: FieldInfo) -> bool:
    """A ``Duration`` field, or an optional one (``Duration | None``)."""
    return is_duration_field(info.metadata) or any(
        is_duration_field(list(getattr(arg, "__metadata__", ()))) for arg in typing.get_args(info.annotation)
    )


def _tables(model: BaseModel, table: str = "") -> Iterator[tuple[str, BaseModel]]:
    """``model`` and every table inside it, with their dotted names (``[[faults]]`` hold none)."""
    yield table, model
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            key = info.alias or name
            yield from _tables(value, f"{table}.{key}" if table else key)


def _faults(p: Policy) -> Iterator[Finding]:
    world = p.world_size()
    seen: set[tuple[int, int]] = set()
    for i, fault in enumerate(p.faults):
        table = f"faults.{i}"
        if world is None:
            yield _f(
                "info",
                "fault-rank-unchecked",
                table,
                "rank",
                fault.rank,
                f'cannot be checked: nproc_per_node = "{p.job.nproc_per_node}" is only known on the node',
                "set nproc_per_node to a number to have fault ranks checked",
            )
        elif fault.rank >= world:
            yield _f(
                "error",
                "fault-rank",
                table,
                "rank",
                fault.rank,
                f"no such rank: the job has ranks 0..{world - 1} "
                f"({p.rendezvous.nodes} nodes x {p.job.nproc_per_node})",
                f"use a rank below {world}",
            )
        if p.job.max_steps is not None and fault.step > p.job.max_steps:
            yield _f(
                "error",
                "fault-step",
                table,
                "step",
                fault.step,
                f"is after the end of the run ([job] max_steps = {p.job.max_steps})",
                f"use a step <= {p.job.max_steps}",
            )
        if (fault.step, fault.rank) in seen:
            yield _f(
                "warning",
                "fault-duplicate",
                table,
                "step",
                fault.step,
                f"another fault already fires at step {fault.step} on rank {fault.rank}; "
                "only the first one happens",
                "move it to another step or rank, or remove it",
            )
        seen.add((fault.step, fault.rank))


def _metrics(p: Policy) -> Iterator[Finding]:
    m = p.metrics
    if m.enabled and m.port == p.rendezvous.port:
        yield _f(
            "error",
            "port-clash",
            "metrics",
            "port",
            m.port,
            f"is also the rendezvous port ([rendezvous] port = {p.rendezvous.port}): pod 0 cannot serve both",
            f"use another port, e.g. port = {9464 if p.rendezvous.port != 9464 else 9465}",
        )


_RULES: tuple[Rule, ...] = (
    _job,
    names,
    _sizes,
    heartbeat,
    _in_process,
    auto_backend,
    _recovery,
    _durations,
    checkpoint,
    _faults,
    _metrics,
)

"""Rules that relate several keys of a valid policy, returned as findings (never raised).

Each rule is a small function that yields findings; ``check`` runs them all so that
``nvtrain validate`` shows every problem at once. Findings carry table and key but no line:
the caller places them in the file.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from nvtrain.config.checks_backend import auto_backend
from nvtrain.config.derive import MAX_DURATION
from nvtrain.config.duration import format_duration, is_duration_field
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding, Severity, toml_value

if TYPE_CHECKING:
    from nvtrain.config.timings import Timings
    from nvtrain.nvrx import NvrxVersion

__all__ = ["MARGIN", "MAX_DURATION", "MAX_NODES", "MAX_NPROC", "check"]

MARGIN = 1.5
"""A timeout checked against measured timings must exceed the longest measured gap by this factor."""

MAX_NPROC = 1024
"""Most worker processes per node (``[job] nproc_per_node``): far beyond the GPUs or cores of a node."""

MAX_NODES = 100_000
"""Most nodes (``[rendezvous] nodes``): Kubernetes' limit on an Indexed Job's completions."""

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123 label
_LABEL_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035 label (Service names)

Rule = Callable[[Policy], Iterator[Finding]]


def _f(
    severity: Severity, code: str, table: str, key: str | None, value: object, rule: str, fix: str
) -> Finding:
    shown = (
        None if value is None else toml_value(format_duration(value) if isinstance(value, float) else value)
    )
    return Finding(severity, code, table, key, rule, fix, shown)


def _d(seconds: float) -> str:
    return format_duration(seconds)


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
        findings.extend(_nvrx_rules(policy, nvrx))
    if timings is not None:
        findings.extend(_timing_rules(policy, timings))
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
    if rule:
        yield _f("error", "job-entrypoint", "job", key, value, rule, fix)


def _suffix(p: Policy) -> str:
    """The longest suffix of a pod name ``<job>-<suffix>``: the last index, or ``control``."""
    last = str(p.rendezvous.nodes - 1)
    return "control" if p.rendezvous.store == "control" and len("control") > len(last) else last


def _names(p: Policy) -> Iterator[Finding]:
    name = p.job.name
    suffix = _suffix(p)
    if not _LABEL.match(name) or len(name) > 63:
        yield _f(
            "error",
            "dns-name",
            "job",
            "name",
            name,
            "must be a DNS label: at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit",
            f'e.g. name = "{_suggest_label(name, limit=62 - len(suffix))}"',
        )
    elif len(f"{name}-{suffix}") > 63:
        yield _f(
            "error",
            "dns-name",
            "job",
            "name",
            name,
            (
                f"the control pod's name `{name}-control` would be longer than 63 characters"
                if suffix == "control"
                else f"pod names `{name}-<index>` would be longer than 63 characters"
            ),
            f"shorten the name to at most {62 - len(suffix)} characters",
        )
    service = p.rendezvous.service
    if service is not None and (not _LABEL_1035.match(service) or len(service) > 63):
        yield _f(
            "error",
            "dns-name",
            "rendezvous",
            "service",
            service,
            "must be a Service name (RFC 1035 label): lowercase letters, digits and '-', "
            "starting with a letter, at most 63 characters",
            f'e.g. service = "{_suggest_label(service, letter_first=True)}"',
        )
    if service is None and _LABEL.match(name) and len(name) <= 63 and not _LABEL_1035.match(name):
        yield _f(
            "error",
            "dns-name",
            "rendezvous",
            "service",
            None,
            f'defaults to the job name "{name}", which is not a valid Service name '
            "(it must start with a letter)",
            f'set service = "{_suggest_label(name, letter_first=True)}"',
        )
    namespace = p.rendezvous.namespace
    if not _LABEL.match(namespace) or len(namespace) > 63:
        yield _f(
            "error",
            "dns-name",
            "rendezvous",
            "namespace",
            namespace,
            "must be a DNS label (lowercase letters, digits, '-'; at most 63)",
            f'e.g. namespace = "{_suggest_label(namespace)}"',
        )
    domain = p.rendezvous.cluster_domain
    labels = domain.split(".")
    if len(domain) > 253 or not all(_LABEL.match(x) and len(x) <= 63 for x in labels):
        yield _f(
            "error",
            "dns-name",
            "rendezvous",
            "cluster_domain",
            domain,
            "must be a DNS name: dot-separated labels of lowercase letters, digits, '-'",
            'the usual value is "cluster.local"',
        )


def _suggest_label(text: str, letter_first: bool = False, limit: int = 63) -> str:
    limit = max(1, min(limit, 63))
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")
    if letter_first and not label[:1].isalpha():
        label = ("x-" + label)[:limit].strip("-")
    return label or "my-job"


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


def _heartbeat(p: Policy) -> Iterator[Finding]:
    hb = p.heartbeat
    if hb.initial_timeout is not None and hb.timeout is not None and hb.initial_timeout < hb.timeout:
        yield _f(
            "error",
            "heartbeat-order",
            "heartbeat",
            "initial_timeout",
            hb.initial_timeout,
            f"must be >= timeout ({_d(hb.timeout)}): the first heartbeat also waits for "
            "start-up and the checkpoint load",
            f'raise it to at least "{_d(hb.timeout)}"',
        )
    fixed = [
        (v, k) for v, k in ((hb.timeout, "timeout"), (hb.initial_timeout, "initial_timeout")) if v is not None
    ]
    if fixed and hb.monitor_interval >= min(fixed)[0]:
        limit, key = min(fixed)
        yield _f(
            "error",
            "heartbeat-interval",
            "heartbeat",
            "monitor_interval",
            hb.monitor_interval,
            f"must be shorter than {key} ({_d(limit)}), or hangs go unnoticed",
            f'use at most "{_d(limit / 10)}"',
        )
    yield from _sections(p)


_SECTION_NAME = re.compile(r"[:,\s]")


def _sections(p: Policy) -> Iterator[Finding]:
    """``[heartbeat.sections]``: names fit ft_launcher's ``name:seconds,...`` argument; timeouts
    are longer than the monitor's interval."""
    hb = p.heartbeat
    table = "heartbeat.sections"
    example = 'e.g. step = "30s" or checkpoint = "auto"'
    for name, timeout in hb.sections.items():
        bad = _SECTION_NAME.search(name)
        if not name:
            rule = "a section name must not be empty"
        elif bad is not None:
            char = {":": "':'", ",": "','"}.get(bad.group(), "whitespace")
            rule = (
                f"section name {toml_value(name)} contains {char}: names go on ft_launcher's command "
                "line as `name:seconds,...`, which cannot hold ':', ',' or whitespace"
            )
        elif not name.isprintable():
            rule = f"section name {toml_value(name)} contains a control character"
        else:
            rule = ""
        if rule:
            fix = (
                "use the name the workers pass to start_section(), made of letters, digits, '_', "
                f"'-' or '.' ({example})"
            )
            yield _f("error", "heartbeat-section", table, name, timeout, rule, fix)
        if isinstance(timeout, float) and timeout > MAX_DURATION:
            yield _f(
                "error",
                "duration-limit",
                table,
                name,
                timeout,
                f"is longer than {_d(MAX_DURATION)} (a year): no section is meant to last that long",
                f'use at most "{_d(MAX_DURATION)}", or "auto" to let NVRx compute it',
            )
        elif isinstance(timeout, float) and timeout <= hb.monitor_interval:
            yield _f(
                "warning",
                "heartbeat-interval",
                table,
                name,
                timeout,
                f"is not longer than [heartbeat] monitor_interval ({_d(hb.monitor_interval)}): the "
                "monitor checks sections only that often, so the timeout acts late or not at all",
                f'raise it above "{_d(hb.monitor_interval)}", or lower monitor_interval to at most '
                f'"{_d(timeout / 5)}"',
            )
    outside = hb.out_of_section_timeout
    if isinstance(outside, float) and outside <= hb.monitor_interval:
        yield _f(
            "warning",
            "heartbeat-interval",
            "heartbeat",
            "out_of_section_timeout",
            outside,
            f"is not longer than monitor_interval ({_d(hb.monitor_interval)}): the monitor checks "
            "only that often, so the timeout acts late or not at all",
            f'raise it above "{_d(hb.monitor_interval)}", or lower monitor_interval to at most '
            f'"{_d(outside / 5)}"',
        )


def _in_process(p: Policy) -> Iterator[Finding]:
    ip = p.restart.in_process
    if not ip.enabled:
        return
    table = "restart.in_process"
    if ip.soft_timeout >= ip.hard_timeout:
        yield _f(
            "error",
            "timeout-order",
            table,
            "soft_timeout",
            ip.soft_timeout,
            f"must be shorter than hard_timeout ({_d(ip.hard_timeout)})",
            f'lower soft_timeout below "{_d(ip.hard_timeout)}" or raise hard_timeout',
        )
    if p.heartbeat.timeout is not None and ip.hard_timeout >= p.heartbeat.timeout:
        yield _f(
            "error",
            "timeout-order",
            table,
            "hard_timeout",
            ip.hard_timeout,
            f"must be shorter than [heartbeat] timeout ({_d(p.heartbeat.timeout)}), "
            "or ft_launcher restarts the workers before the in-process layer acts",
            f'lower hard_timeout below "{_d(p.heartbeat.timeout)}" or raise the heartbeat timeout',
        )
    if ip.failure_window is not None and ip.failure_window >= ip.soft_timeout:
        yield _f(
            "error",
            "timeout-order",
            table,
            "failure_window",
            ip.failure_window,
            f"must be shorter than soft_timeout ({_d(ip.soft_timeout)}): every soft fault waits "
            "this long before it is handled",
            'use a fraction of a second, e.g. "100ms"',
        )
    elif ip.failure_window is not None and ip.failure_window > 5.0:
        yield _f(
            "warning",
            "slow-recovery",
            table,
            "failure_window",
            ip.failure_window,
            "every in-process restart waits this long before it starts; ranks that fail together "
            "report within a fraction of a second of each other",
            'use "100ms" unless measured failures of one fault are spread wider',
        )
    collective = p.job.collective_timeout
    backend = p.job.backend
    if backend == "auto":  # what the workers will pick: gloo for CPU jobs, NCCL on GPUs
        backend = "gloo" if p.job.nproc_per_node == "cpu" else "nccl"
    if backend == "gloo":
        ranks = p.world_size()
        if ip.soft_timeout <= collective < ip.hard_timeout and (ranks is None or ranks > 1):
            yield _f(
                "error",
                "timeout-order",
                "job",
                "collective_timeout",
                collective,
                f"must be shorter than [restart.in_process] soft_timeout ({_d(ip.soft_timeout)}) "
                "with gloo: a rank blocked in a gloo collective with a failed peer returns only at "
                "this timeout, and NVRx re-raises its restart into a rank that has not returned "
                "one soft timeout after the fault, which can end that rank instead of restarting it",
                f'lower it below "{_d(ip.soft_timeout)}", e.g. "{_d(ip.soft_timeout * 3 / 4)}"',
            )
        if collective >= ip.hard_timeout:
            yield _f(
                "error",
                "timeout-order",
                "job",
                "collective_timeout",
                collective,
                f"must be shorter than [restart.in_process] hard_timeout "
                f"({_d(ip.hard_timeout)}) with gloo: gloo collectives cannot be aborted, so "
                "surviving ranks stay blocked until this timeout and are killed first",
                f'lower it below "{_d(ip.hard_timeout)}", e.g. "{_d(ip.hard_timeout * 2 / 3)}"',
            )
    elif collective <= ip.hard_timeout:
        yield _f(
            "error",
            "timeout-order",
            "job",
            "collective_timeout",
            collective,
            f"must be longer than [restart.in_process] hard_timeout ({_d(ip.hard_timeout)}) "
            "with NCCL, or the collective timeout ends the process before the in-process "
            "layer can restart it",
            f'raise it above "{_d(ip.hard_timeout)}", or set backend = "gloo" for CPU jobs',
        )


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


def _checkpoint(p: Policy) -> Iterator[Finding]:
    c = p.checkpoint
    if "\0" in c.dir:
        yield _f(
            "error",
            "checkpoint-dir",
            "checkpoint",
            "dir",
            c.dir,
            "contains a NUL character, which no path can hold",
            f'e.g. dir = "/checkpoints/{_suggest_label(p.job.name)}"',
        )
    elif not c.dir.startswith("/"):
        yield _f(
            "error",
            "checkpoint-dir",
            "checkpoint",
            "dir",
            c.dir,
            "must be an absolute path (workers may start in another directory)",
            f'e.g. dir = "/checkpoints/{_suggest_label(p.job.name)}"',
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
    _names,
    _sizes,
    _heartbeat,
    _in_process,
    auto_backend,
    _recovery,
    _durations,
    _checkpoint,
    _faults,
    _metrics,
)


LARGE_JOB_NODES = 1000
"""From this many nodes NVRx 0.4's rendezvous store is near what it can take (measured and
worked out in docs/architecture.md, "At 1,000+ nodes")."""


def _nvrx_rules(p: Policy, v: NvrxVersion) -> Iterator[Finding]:
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


def _longest_gap(t: Timings) -> tuple[float, str] | None:
    """The longest gap between two heartbeats of healthy workers, and what it is, in words: the
    longest step, or, when the loop runs an evaluation between steps, a median step and the
    longest evaluation after it, whichever is longer. None without ``step`` and ``eval``."""
    gaps: list[tuple[float, str]] = []
    if t.step is not None:
        gaps.append((t.step.worst, f"the longest measured step ({_d(t.step.worst)})"))
    if t.eval is not None:
        if t.step is None:
            gaps.append((t.eval.worst, f"the longest measured evaluation ({_d(t.eval.worst)})"))
        else:
            gap = t.step.median + t.eval.worst
            gaps.append(
                (
                    gap,
                    f"the longest measured step plus evaluation ({_d(gap)}: median step "
                    f"{_d(t.step.median)} + longest eval {_d(t.eval.worst)})",
                )
            )
    return max(gaps, key=lambda g: g[0]) if gaps else None


def _timing_rules(p: Policy, t: Timings) -> Iterator[Finding]:
    hb = p.heartbeat
    longest = _longest_gap(t)
    if longest is not None:
        gap, what = longest
        for table, key, limit in (
            ("heartbeat", "timeout", hb.timeout),
            (
                "restart.in_process",
                "soft_timeout",
                p.restart.in_process.soft_timeout if p.restart.in_process.enabled else None,
            ),
        ):
            if limit is None:
                continue
            if limit <= gap:
                yield _f(
                    "error",
                    "timeout-measured",
                    table,
                    key,
                    limit,
                    f"is not longer than {what}: healthy workers would be taken for hung",
                    f'raise it to at least "{_d(gap * MARGIN)}"',
                )
            elif limit < gap * MARGIN:
                yield _f(
                    "warning",
                    "timeout-margin",
                    table,
                    key,
                    limit,
                    f"leaves less than {MARGIN}x margin over {what}",
                    f'raise it to at least "{_d(gap * MARGIN)}"',
                )
    startup = sum(m.worst for m in (t.restore, t.step) if m is not None)
    if t.restore is not None and hb.initial_timeout is not None and hb.initial_timeout < startup * MARGIN:
        yield _f(
            "warning",
            "timeout-margin",
            "heartbeat",
            "initial_timeout",
            hb.initial_timeout,
            f"leaves less than {MARGIN}x margin over the measured checkpoint load and first "
            f"step ({_d(startup)})",
            f'raise it to at least "{_d(startup * MARGIN)}"',
        )
    if t.save_write is not None and p.job.stop_timeout < t.save_write.worst:
        yield _f(
            "warning",
            "stop-before-write",
            "job",
            "stop_timeout",
            p.job.stop_timeout,
            f"is shorter than the longest measured checkpoint write ({_d(t.save_write.worst)}): "
            "a pod stopped during a save is killed before the checkpoint is committed (the "
            "manifests derive terminationGracePeriodSeconds from this value)",
            f'raise it to at least "{_d(t.save_write.worst * MARGIN)}"',
        )
    c = p.checkpoint
    if c.async_ and t.step is not None and t.save_write is not None:
        between = c.interval * t.step.median
        if between < t.save_write.median:
            need = math.ceil(t.save_write.median * MARGIN / t.step.median - 1e-9)
            yield _f(
                "warning",
                "write-bound",
                "checkpoint",
                "interval",
                c.interval,
                f"{c.interval} steps take about {_d(between)}, less than one background write "
                f"({_d(t.save_write.median)}): each save waits for the previous write",
                f"use interval >= {int(need)}, or faster storage",
            )

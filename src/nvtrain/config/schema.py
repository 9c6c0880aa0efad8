"""The policy: one TOML file per training job, read by the launcher and by every worker.

Each table of the file is a model below; each key is a field with its docstring (shown in
``docs/policy.md`` and in the JSON Schema). Type checks live here; rules that relate several keys
live in ``checks.py`` and ``checks_*.py`` (the timeout order is ``timeouts.py``'s table) so that
``nvtrain validate`` can report all of them at once and warn.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import ipaddress
import os
import re
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    field_validator,
    model_validator,
)

from nvtrain.config.derive import (
    CHECKPOINT_INTERVAL,
    COLLECTIVE_TIMEOUT,
    ESCALATE_AFTER,
    HARD_TIMEOUT,
    METRICS_PORT,
    MONITOR_INTERVAL,
    RENDEZVOUS_PORT,
    SOFT_TIMEOUT,
    derive_defaults,
)
from nvtrain.config.duration import Duration

__all__ = [
    "Checkpoint",
    "Fault",
    "FaultKind",
    "Heartbeat",
    "InJobRestart",
    "InProcessRestart",
    "Job",
    "Metrics",
    "Policy",
    "Rendezvous",
    "Restart",
    "table_model",
]

POLICY_CONFIG = ConfigDict(
    extra="forbid",
    frozen=True,
    strict=True,
    populate_by_name=True,
    # Built at the end of this module, once the field docstrings are attached (`_build`).
    defer_build=True,
)


def _no_sections() -> dict[str, Any]:
    """``default_factory`` of ``[heartbeat.sections]`` (see ``_no_items``)."""
    return {}


def _no_items() -> list[Any]:
    """``default_factory`` of the list keys. Not ``list``: pydantic reads a factory's signature,
    and a builtin's is parsed from text by the tokenizer (~10 ms of `validate`'s start-up)."""
    return []


FaultKind = Literal["exception", "hang", "collective_hang", "sigkill", "collective_sigkill", "oom", "sigterm"]


class Job(BaseModel):
    """What to run."""

    model_config = POLICY_CONFIG

    name: str = Field(min_length=1)
    """Name of the training job: a DNS label (lowercase letters, digits, '-'). It prefixes the
    run id and, on Kubernetes, names the Job and its pods (`<name>-<index>`)."""

    script: str | None = None
    """Path of the training script each worker runs (like `torchrun train.py`). Give either
    `script` or `module`."""

    warm_start: bool = True
    """Start workers warm (on unless set to false, for scripts that import nvtrain's worker
    library; a script that does not starts warm only when this is set to true): `nvtrain run`
    keeps an interpreter with torch
    and the script's top-level imports loaded (NVRx and nvtrain's worker library too when the
    script uses it; CUDA not initialised) and forks each worker from it, so a worker that replaces
    a killed one skips the interpreter start and the imports. Signals, exit codes and output are
    the worker's own, as ft_launcher expects. The first workers wait for the server's imports (one
    import per pod instead of one per worker). Where forking is not safe (an import initialised
    CUDA or started a thread) or the server cannot serve, the workers start cold and one line on
    stderr says why; `false` skips the server (a script whose imports need CUDA, or must run in
    each worker)."""

    module: str | None = None
    """Python module each worker runs (like `python -m mypkg.train`). Give either `script` or
    `module`."""

    args: list[str] = Field(default_factory=_no_items)
    """Arguments passed to the training script or module."""

    nproc_per_node: int | Literal["gpu", "cpu"] = Field(default=1)
    """Worker processes per node: a number, `"gpu"` (one per visible GPU) or `"cpu"` (one per
    CPU core)."""

    max_steps: int | None = Field(default=None, ge=1)
    """Training steps the script runs, if known. Lets `validate` check fault steps and the
    checkpoint interval against the length of the run. Unit: steps."""

    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """Collective backend of the workers' process group: `"nccl"` on GPUs, `"gloo"` on CPUs,
    `"auto"` picks NCCL when CUDA is available. It decides how collectives and the in-process
    timeouts must relate (NCCL collectives can be aborted, gloo collectives cannot)."""

    stop_timeout: Duration = 60.0
    """After SIGTERM (pod deletion, preemption), how long the workers get to finish, e.g. the
    checkpoint in flight, before they are killed. The pod's `terminationGracePeriodSeconds` must
    be longer."""

    collective_timeout: Duration = COLLECTIVE_TIMEOUT
    """Timeout of the workers' collectives (the `torch.distributed` process-group timeout). With
    NCCL it must exceed the in-process hard timeout (NVRx aborts a hung NCCL collective; the
    timeout would kill the process first). Gloo collectives cannot be aborted, so with gloo it
    must be shorter than the in-process soft timeout: the timeout is what frees the surviving
    ranks. Default: 10 minutes, or twice `[restart.in_process] hard_timeout` when that is longer;
    with gloo (in-process restart on) three quarters of `[restart.in_process] soft_timeout`."""


class Rendezvous(BaseModel):
    """How the pods of the job find each other (headless-Service DNS and the c10d rendezvous)."""

    model_config = POLICY_CONFIG

    service: str | None = None
    """Name of the headless Service that gives each pod its DNS name. Default: the job name."""

    namespace: str = "default"
    """Kubernetes namespace of the job."""

    cluster_domain: str = "cluster.local"
    """DNS domain of the cluster."""

    host: str | None = Field(default=None, min_length=1, max_length=253)
    """Address or name of the rendezvous store's host off Kubernetes (bare metal): node 0, or
    where `nvtrain control` runs; torchrun's `--master-addr`. Unset: pod 0's DNS name on
    Kubernetes, the first node of the step under Slurm (`srun`)."""

    @field_validator("host")
    @classmethod
    def _host_shape(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_.%-]+|\[?[0-9A-Fa-f:.%]+\]?", value):
            raise ValueError(
                "is not an IP address or a host name; write node 0's address or name, e.g. "
                'host = "10.0.0.1" or host = "node01"'
            )
        return value

    port: int = Field(default=RENDEZVOUS_PORT, ge=1, le=65535)
    """TCP port of the rendezvous store on pod 0. Default: 29500, or 29501 when `[metrics] port`
    is 29500."""

    nodes: int = Field(default=1, ge=1)
    """Nodes (pods) the job wants. Unit: nodes. Default: 1, or `min_nodes` when that is set."""

    min_nodes: int | None = Field(default=None, ge=1)
    """Fewest nodes the job may run with. Default: `nodes` (a fixed-size job). Its meaning depends
    on the NVRx version: 0.4 shrinks the world to the nodes that are left; 0.6 and later run a
    fixed world of `min_nodes` and keep the other nodes as hot spares."""

    dns_timeout: Duration = 300.0
    """How long a pod waits for its peers' DNS records before it gives up (exit 3)."""

    join_timeout: Duration = 900.0
    """How long the rendezvous waits for all nodes to join (covers pod start skew)."""

    store: Literal["pod0", "control"] = "pod0"
    """Where the rendezvous store lives. `"pod0"`: in pod 0's launcher; when pod 0 is lost the
    other pods start their launchers again once its replacement is up. `"control"` (NVRx 0.6 and
    later): in a small CPU pod of its own, `<job>-control`, that runs `nvtrain control`; no
    training pod is special and the job survives the loss of any of them without a restart of
    the other launchers."""

    store_allow: list[str] = Field(default_factory=list, max_length=64)
    """Off Kubernetes: the hosts that may connect to the rendezvous store, as IPv4 addresses,
    CIDRs (`"10.0.0.0/24"`) or host names (resolved on node 0 when the store starts), e.g. the
    job's nodes. The store's host drops every other IPv4 connection, and every IPv6 one, before it
    is accepted (docs/security.md). Empty: any host that can reach the port (on Kubernetes the
    NetworkPolicy admits only the job's pods)."""

    @field_validator("store_allow")
    @classmethod
    def _allow_shape(cls, value: list[str]) -> list[str]:
        for entry in value:
            with contextlib.suppress(ValueError):
                ipaddress.IPv4Network(entry, strict=False)
                continue
            label = r"[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?"
            name = re.fullmatch(rf"{label}(\.{label})*", entry)
            if name is None or re.fullmatch(r"[0-9./]+", entry):  # 10.0.0.300 is no name
                raise ValueError(
                    f"entry {entry!r} is not an IPv4 address, an IPv4 CIDR or a host name (IPv6 is not "
                    'supported); write e.g. store_allow = ["10.0.0.11", "10.0.1.0/24", "node02"]'
                )
        return value


class Heartbeat(BaseModel):
    """Hang detection by ft_launcher's per-rank monitors (NVRx's fault-tolerance config)."""

    model_config = POLICY_CONFIG

    initial_timeout: Duration | None = None
    """Longest wait for a worker's first heartbeat: start-up, model build and checkpoint load.
    Unset: NVRx's own behaviour, as under ft_launcher without this timeout: no limit until the
    workers ask NVRx to compute one from what it observed (`calculate_and_set_hb_timeouts`;
    nvtrain's worker library does so after its first steps)."""

    timeout: Duration | None = None
    """Longest gap between two heartbeats in steady state. A rank silent for longer is
    considered hung and the workers are restarted. Unset: NVRx's own behaviour (computed by
    NVRx when the workers ask for it, as for `initial_timeout`)."""

    monitor_interval: Duration = MONITOR_INTERVAL
    """How often ft_launcher checks its workers and their heartbeats. Default: 5 s, or a fifth
    of the shortest fixed timeout (`timeout`, `initial_timeout`, `out_of_section_timeout`, a
    section's) when that is shorter."""

    sections: dict[str, Duration | Literal["auto"]] = Field(default_factory=_no_sections)
    """Timeouts of named sections of the workers' code, for clients of NVRx's sections API
    (`start_section("step")` ... `end_section("step")`), like ft_launcher's
    `rank_section_timeouts`: a section open for longer is a hang. `"auto"`: declared with no
    fixed timeout, for NVRx to compute (`calculate_and_set_section_timeouts`). A section the
    workers open must be declared (NVRx 0.4 rejects unknown names). E.g. `init = "5m"`,
    `step = "30s"`, `checkpoint = "auto"`."""

    out_of_section_timeout: Duration | Literal["auto"] | None = None
    """Longest time no section is open (ft_launcher's `rank_out_of_section_timeout`). Unset or
    `"auto"`: no fixed limit (NVRx computes one when asked)."""


class InProcessRestart(BaseModel):
    """In-process restart (NVRx `inprocess.Wrapper`): soft faults are handled without a new process."""

    model_config = POLICY_CONFIG

    enabled: bool = True
    """Restart the training function inside the running process after an exception or a
    detected hang."""

    max_attempts: int = Field(default=10, ge=1)
    """In-process restarts allowed before the fault is passed to the in-job layer."""

    soft_timeout: Duration = SOFT_TIMEOUT
    """No progress for this long: abort the collectives and restart in process. Default: 1
    minute, or two thirds of `hard_timeout` when that is shorter (and always longer than
    `failure_window` and, with gloo, `[job] collective_timeout` when those are set)."""

    hard_timeout: Duration = HARD_TIMEOUT
    """No progress for this long: kill the process and let ft_launcher restart the workers.
    Default: 90 s, or two thirds of `[heartbeat] timeout` (and, with NCCL, of `[job]
    collective_timeout`) when that is shorter; 1.5 x `soft_timeout` when that is longer (kept
    below the heartbeat timeout)."""

    min_world_size: int | None = Field(default=None, ge=1)
    """Fewest ranks the in-process layer may continue with. Default: every rank the workers
    started with, so a rank lost to a hard fault is left to ft_launcher, which restarts them
    all; lower it only for training that gives the same results in a smaller world (the data of
    the lost ranks is not trained, so the run diverges from one without faults). Unit: ranks."""

    failure_window: Duration | None = None
    """After the first rank fails, how long NVRx waits before it restarts the ranks
    (`last_call_wait`): failures reported within it are named in the restart's record. Every
    soft fault waits this long before it is handled. A failure that comes later joins the same
    restart all the same, and a rank that died is counted whenever it dies. Default: `"10ms"`,
    or a quarter of `soft_timeout` when that is shorter."""

    @property
    def window(self) -> float:
        """``failure_window`` in seconds, its default filled in."""
        if self.failure_window is not None:
            return self.failure_window
        return min(0.01, self.soft_timeout / 4)


class InJobRestart(BaseModel):
    """In-job restart by ft_launcher: the workers of every pod are started again."""

    model_config = POLICY_CONFIG

    max_restarts: int = Field(default=5, ge=0)
    """Worker-group restarts ft_launcher may do. 0 disables in-job restarts."""

    policy: Literal["any-failed", "min-healthy"] = "any-failed"
    """When ft_launcher restarts: `"any-failed"` on any failed worker; `"min-healthy"` (NVRx 0.4
    only) when fewer than `min_nodes` nodes are healthy."""


class Restart(BaseModel):
    """Restart limits of the recovery layers, and when to give up."""

    model_config = POLICY_CONFIG

    escalate_after: int = Field(default=ESCALATE_AFTER, ge=1)
    """Stop the job (exit 4, never retried) when the same step or the same rank fails this many
    times in a row without progress. Default: 3, or `[restart.in_job] max_restarts` + 1 when
    in-process restart is off and that is smaller (the budget ends the job first). A failure
    before the first step that repeats with the same error (not a peer's) stops the job at its
    second occurrence, with the script's error in the cause."""

    in_process: InProcessRestart = Field(default_factory=InProcessRestart)
    in_job: InJobRestart = Field(default_factory=InJobRestart)


class Checkpoint(BaseModel):
    """Sharded checkpoints of model and optimizer state."""

    model_config = POLICY_CONFIG

    dir: str = "/checkpoints"
    """Absolute path of the checkpoint directory, on storage every pod mounts. Checkpoints go to
    `<dir>/<run id>/step-<N>/`."""

    interval: int = Field(default=CHECKPOINT_INTERVAL, ge=1)
    """Steps between two checkpoints. Unit: steps. Default: 1000, or a tenth of `[job]
    max_steps` (at least 1) when that is fewer."""

    async_: bool = Field(default=True, alias="async")
    """Save in the background: training is blocked only while the state is copied to host
    memory."""

    in_memory: bool = True
    """Restore from the staged copy that async saves keep in host memory when every rank holds
    the newest committed checkpoint: after an in-process restart (the same process), and after a
    worker is replaced (SIGKILL, OOM kill, crash) from the files `nvtrain run` keeps in
    `memory_dir`; `false` always reads storage."""

    memory_dir: str = "/dev/shm"
    """Memory-backed folder where `nvtrain run` keeps each rank's staged copy (two slots of the
    rank's state, plus the copy a peer sends with `peer_copy`) so that a replacement worker
    restores from memory; removed when the run ends. `""` keeps the copy in the worker process
    only."""

    peer_copy: bool = True
    """Keep each rank's host copy on a second pod as well, so that a pod that replaces a lost one
    (its `memory_dir` starts empty) restores from memory instead of storage. After each save, once
    its host copy is sealed (complete), each rank sends it in the background to the rank with the same
    local rank on the next pod (rank r to rank (r + ranks per pod) mod world), which keeps it in
    its own `memory_dir`. Acts with `[rendezvous] nodes` > 1 and the host copy on (`async` and
    `in_memory` true, `memory_dir` not `""`). Costs one more copy of a rank's state in each pod's
    `memory_dir` (3 x the state per rank instead of 2 x) and the checkpoint's bytes sent once
    over the pod network per save. `false` turns it off."""

    write_threads: int = Field(default=4, ge=1, le=64)
    """Threads (and shard files) per rank that write a checkpoint to storage. On one H200 with a
    local disk, 4 threads wrote an 8.86 GB state at 1.5x the rate of 1."""

    keep: int = Field(default=3, ge=1)
    """Committed checkpoints to keep; older ones are deleted. At least 2 with `async`, so a
    complete checkpoint survives while the next one is being written."""

    finish_in_flight: bool = True
    """At a soft fault (in-process restart), let the save still being written finish before the
    collectives are aborted, for up to half the gap between the in-process soft and hard
    timeouts, so the restart resumes from it; `false` drops it at once and goes back to the
    previous checkpoint."""


class Fault(BaseModel):
    """One deterministic fault to inject, for tests and benchmarks. Fires once per run."""

    model_config = POLICY_CONFIG

    step: int = Field(ge=1)
    """Training step at which the fault fires."""

    rank: int = Field(ge=0)
    """Global rank that fails."""

    kind: FaultKind
    """`exception` (raise), `hang` (stop in Python: no progress, no heartbeats),
    `collective_hang` (block in a collective that the other ranks never join), `sigkill`,
    `collective_sigkill` (SIGKILL with a receive from a peer still pending), `oom` (exit 137) or
    `sigterm`. A `sigkill` at a checkpoint step kills the rank while that save is written."""


class Metrics(BaseModel):
    """Live figures of the run for Prometheus, served by `nvtrain run` on every pod."""

    model_config = POLICY_CONFIG

    enabled: bool = False
    """Serve the figures of `nvtrain report` (goodput, recoveries, restarts, checkpoint
    freshness) while the job runs, in the Prometheus text format at
    `http://<pod>:<port>/metrics`."""

    port: int = Field(default=METRICS_PORT, ge=1, le=65535)
    """TCP port of the metrics endpoint on each pod. Must differ from the rendezvous port.
    Default: 9464, or 9465 when `[rendezvous] port` is 9464."""

    refresh: Duration = 5.0
    """How often the figures are recomputed from the events log when it has grown. On a long
    log a computation takes longer (about 1 s per 100,000 events): then they are recomputed no
    more often than every 4 computation times, so they use at most a quarter of a CPU core."""

    linger: Duration = 30.0
    """How long `nvtrain run` goes on serving the final figures (the exit code among them) after
    the run ended with exit 0, 2 or 4 (finished, or the Job fails), so that a scrape sees how it
    ended: at least the scrape interval. The pod keeps its node (and its GPUs) meanwhile. There
    is no wait after exit 1 or 3 (Kubernetes starts the replacement pod only once this one has
    ended) nor after a signal, and a signal during the wait (SIGTERM when the pod is deleted,
    Ctrl-C) ends it at once, so the pod's termination grace period is never used for it."""


class Policy(BaseModel):
    """A training job's fault-tolerance policy."""

    model_config = POLICY_CONFIG

    job: Job
    rendezvous: Rendezvous = Field(default_factory=Rendezvous)
    heartbeat: Heartbeat = Field(default_factory=Heartbeat)
    restart: Restart = Field(default_factory=Restart)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    metrics: Metrics = Field(default_factory=Metrics)
    faults: list[Fault] = Field(default_factory=_no_items)

    _derived: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _derive_defaults(cls, data: Any, handler: ModelWrapValidatorHandler[Policy]) -> Policy:
        """Fill the keys the data leaves unset from the keys it sets (``derive.py``)."""
        data, derived = derive_defaults(data)
        policy = handler(data)
        policy._derived = derived
        return policy

    def __eq__(self, other: object) -> bool:
        """Equal values are equal policies, whether a value was derived or written."""
        if not isinstance(other, Policy):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    @property
    def derived(self) -> Mapping[str, str]:
        """The keys whose default was derived from keys the policy sets: ``{"table.key": the
        keys it follows}``. Empty for a policy read back from JSON (every key is set there)."""
        return self._derived

    @property
    def service(self) -> str:
        """The headless Service's name (defaults to the job name)."""
        return self.rendezvous.service or self.job.name

    @property
    def min_nodes(self) -> int:
        return self.rendezvous.min_nodes or self.rendezvous.nodes

    def world_size(self, nproc_per_node: int | None = None) -> int | None:
        """Ranks in the full job, or None when `nproc_per_node` is "gpu"/"cpu" and not given."""
        nproc = self.job.nproc_per_node if nproc_per_node is None else nproc_per_node
        return None if isinstance(nproc, str) else self.rendezvous.nodes * nproc


def _attribute_docstrings(source: str) -> dict[str, dict[str, str]]:
    """``{class: {field: docstring}}``: the string after each annotated field of each class."""
    docs: dict[str, dict[str, str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            fields = docs.setdefault(node.name, {})
            for field, doc in zip(node.body, node.body[1:], strict=False):
                if (
                    isinstance(field, ast.AnnAssign)
                    and isinstance(field.target, ast.Name)
                    and isinstance(doc, ast.Expr)
                    and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)
                ):
                    fields[field.target.id] = inspect.cleandoc(doc.value.value)
    return docs


@contextlib.contextmanager
def _pydantic_plugins_off() -> Iterator[None]:
    """No pydantic plugin lookup: the first one reads every installed package's entry points
    (~15 ms of `nvtrain validate`'s start-up). typer builds its own validators the same way."""
    previous = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["PYDANTIC_DISABLE_PLUGINS"]
        else:
            os.environ["PYDANTIC_DISABLE_PLUGINS"] = previous


def _build() -> None:
    """Attach the field docstrings as descriptions (docs, JSON Schema), then build the models.

    This is what pydantic's ``use_attribute_docstrings`` does, for a fraction of its start-up
    cost on Python < 3.13 (it walks the stack and scans ``sys.modules`` for every class): one
    parse of this file. Models are built in the order they are defined, nested ones first.
    """
    models = [
        value
        for value in globals().values()
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == __name__
    ]
    try:
        docs = _attribute_docstrings(Path(__file__).read_text(encoding="utf-8"))
    except OSError:  # no source (e.g. a bytecode-only install): no descriptions, as pydantic
        docs = {}
    for model in models:
        for name, info in model.model_fields.items():
            if info.description is None and name in docs.get(model.__name__, {}):
                info.description = docs[model.__name__][name]
    with _pydantic_plugins_off():
        for model in models:
            model.model_rebuild(force=True)


_build()


def table_model(annotation: Any) -> type[BaseModel] | None:
    """The model inside a field's annotation (``Heartbeat``, ``list[Fault]``...), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = table_model(arg)
        if found is not None:
            return found
    return None

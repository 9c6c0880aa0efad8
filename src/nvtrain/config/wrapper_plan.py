"""What the workers pass to NVRx's in-process ``Wrapper``, worked out from the policy alone.

``worker/restart.py`` builds the ``Wrapper`` (and the store under it) from a ``WrapperPlan``;
``nvtrain run --dry-run`` shows the same plan. This module imports neither torch nor NVRx: what
the workers learn only on their machine comes in as arguments (the world size, whether CUDA is
there, which parameters the installed ``Wrapper`` takes), each ``None`` when not known yet, as at
a dry run before the node is known.

It lives in ``config`` rather than ``worker`` because ``nvtrain.worker`` imports torch, which the
CLI must not need for a dry run. The order the values keep is ``timeouts.py``'s.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Collection

from nvtrain.config.duration import format_duration
from nvtrain.config.schema import Policy
from nvtrain.config.timeouts import barrier
from nvtrain.nvrx import NvrxVersion

__all__ = ["WrapperFeatures", "WrapperPlan", "plan_wrapper"]

_Delta = datetime.timedelta


@dataclasses.dataclass(frozen=True)
class WrapperFeatures:
    """Which of the ``Wrapper``'s optional parameters the installed NVRx has (None: not known)."""

    last_call_wait: bool | None
    """``last_call_wait`` (NVRx 0.4 to 0.7)."""
    restart_health_check: bool | None
    """The ``restart_health_check`` attribute (NVRx 0.6 and later)."""

    @classmethod
    def of(cls, parameters: Collection[str], has_restart_health_check: bool | None) -> WrapperFeatures:
        """What the workers see: the ``Wrapper``'s parameters, and its attributes once built
        (None before)."""
        return cls("last_call_wait" in parameters, has_restart_health_check)

    @classmethod
    def of_version(cls, version: NvrxVersion | None) -> WrapperFeatures:
        """What a version is known to have (for a dry run): the versions nvtrain is tested with
        all take ``last_call_wait``, and 0.6 added ``restart_health_check``; nothing is known of
        another version, or with none installed."""
        if version is None or not version.tested:
            return cls(None, None)
        return cls(True, version.barrier_rendezvous)


@dataclasses.dataclass(frozen=True)
class WrapperPlan:
    """The arguments of ``inprocess.Wrapper`` and the store under it, as the workers pass them.

    ``None`` marks what a dry run does not know yet: the world size (``monitor_thread_interval``,
    ``min_world_size``), the GPU (``cuda_health_check``, ``cpu_restart_health_check``), or the
    NVRx version's parameters (``last_call_wait``'s ``passed``)."""

    soft_timeout: _Delta
    """``[restart.in_process] soft_timeout``: no progress this long, NVRx restarts in process."""
    hard_timeout: _Delta
    """``[restart.in_process] hard_timeout``: no progress this long, NVRx kills the process."""
    barrier_timeout: _Delta
    """NVRx's barriers between attempts, its ``completion_timeout`` and the store's timeout (the
    Wrapper's ``store_kwargs`` and the TCPStore under every attempt's store): past the hard
    timeout, by when a hung rank is killed, by the soft timeout, at least 30 s
    (``timeouts.barrier``)."""
    heartbeat_timeout: _Delta
    """How long NVRx waits for a peer's heartbeat: the soft timeout, at most half the barrier's."""
    heartbeat_interval: _Delta
    """How often a rank's heartbeat and progress watchdog tick (``heartbeat_interval``,
    ``progress_watchdog_interval``): a tenth of the soft timeout, at most 1 s."""
    monitor_process_interval: _Delta
    """A quarter of the tick. NVRx's monitor process checks the timeouts only when its queue
    read times out, and the progress watchdog sends it a message every tick: with equal
    intervals a read almost never times out and a hang in Python went undetected until the
    heartbeat timeout. Reading four times as often as messages arrive lets the check run."""
    monitor_thread_interval: _Delta | None
    """NVRx's monitor thread waits on the store for an interruption this long at a time, on the
    client that the rank's completion (``record_completed``) then uses: the client serialises
    the two, so a finished run waited up to a whole interval (1 s) before it could exit. Shorter
    waits cost store requests (one wait and its cancel per rank per interval): 0.1 s up to 100
    ranks, growing with the world to the tick at 1,000 (1,000 waits/s at most). None: the world
    size is not known yet."""
    last_call_wait: _Delta
    """``[restart.in_process] failure_window`` (its default filled in): NVRx's ``last_call_wait``
    (0.4 to 0.7; 1 s by default)."""
    last_call_wait_passed: bool | None
    """Whether the installed NVRx takes ``last_call_wait`` (None: not known)."""
    max_iterations: int
    """``RetryController(max_iterations=)``: ``[restart.in_process] max_attempts``."""
    min_world_size: int | None
    """``RetryController(min_world_size=)``: ``[restart.in_process] min_world_size``, by default
    every rank (None: the world size is not known yet)."""
    cuda_health_check: bool | None
    """Whether NVRx's ``CudaHealthCheck`` runs at each restart: with a GPU (None: not known)."""
    cpu_restart_health_check: bool | None
    """Whether ``restart_health_check`` is replaced by the plain health check: NVRx 0.6+ adds
    GPU, NVLink and NIC checks to every restart; without a GPU they fail, with one they stay
    (None: not known whether the node has a GPU or the NVRx version the attribute)."""

    def replaces_restart_health_check(self, has_attribute: bool) -> bool:
        """Whether the workers replace ``restart_health_check`` (``has_attribute``: the built
        ``Wrapper`` has one): without a GPU."""
        return has_attribute and self.cuda_health_check is False

    def rows(self) -> list[tuple[str, str]]:
        """The plan as (argument, value) pairs, in words, for ``nvtrain run --dry-run``."""

        def d(value: _Delta | None, unknown: str = "set on the node (world size)") -> str:
            return unknown if value is None else format_duration(value.total_seconds())

        def flag(value: bool | None, yes: str, no: str, unknown: str) -> str:
            return unknown if value is None else yes if value else no

        passed = flag(
            self.last_call_wait_passed,
            "",
            " (not passed: this NVRx has no last_call_wait)",
            " (passed where NVRx takes it: 0.4 to 0.7)",
        )
        return [
            ("soft_timeout", d(self.soft_timeout)),
            ("hard_timeout", d(self.hard_timeout)),
            ("heartbeat_timeout", d(self.heartbeat_timeout)),
            ("barrier_timeout", d(self.barrier_timeout)),
            ("completion_timeout", d(self.barrier_timeout)),
            ("store timeout (store_kwargs, TCPStore)", d(self.barrier_timeout)),
            ("last_call_wait", d(self.last_call_wait) + passed),
            ("heartbeat_interval", d(self.heartbeat_interval)),
            ("progress_watchdog_interval", d(self.heartbeat_interval)),
            ("monitor_process_interval", d(self.monitor_process_interval)),
            ("monitor_thread_interval", d(self.monitor_thread_interval)),
            ("RetryController max_iterations", str(self.max_iterations)),
            (
                "RetryController min_world_size",
                "every rank (set on the node)" if self.min_world_size is None else str(self.min_world_size),
            ),
            (
                "health_check",
                flag(self.cuda_health_check, "CudaHealthCheck", "none", "CudaHealthCheck with a GPU"),
            ),
            (
                "restart_health_check",
                flag(
                    self.cpu_restart_health_check,
                    "replaced by health_check (no GPU)",
                    "NVRx's own",
                    "NVRx's own; replaced by health_check on NVRx 0.6+ without a GPU",
                ),
            ),
        ]


def plan_wrapper(
    policy: Policy,
    *,
    world: int | None,
    has_gpu: bool | None,
    features: WrapperFeatures,
) -> WrapperPlan:
    """The ``Wrapper`` arguments for ``policy``'s in-process layer with ``world`` ranks."""
    ip = policy.restart.in_process
    soft, hard = ip.soft_timeout, ip.hard_timeout
    wait = barrier(soft, hard)
    tick = _Delta(seconds=min(1.0, soft / 10))
    monitor_wait = None if world is None else min(tick, _Delta(seconds=max(0.1, world / 1000)))
    replace = None
    if has_gpu is not None and features.restart_health_check is not None:
        replace = features.restart_health_check and not has_gpu
    elif has_gpu is True or features.restart_health_check is False:
        replace = False
    return WrapperPlan(
        soft_timeout=_Delta(seconds=soft),
        hard_timeout=_Delta(seconds=hard),
        barrier_timeout=_Delta(seconds=wait),
        heartbeat_timeout=_Delta(seconds=min(soft, wait / 2)),
        heartbeat_interval=tick,
        monitor_process_interval=tick / 4,
        monitor_thread_interval=monitor_wait,
        last_call_wait=_Delta(seconds=ip.window),
        last_call_wait_passed=features.last_call_wait,
        max_iterations=ip.max_attempts,
        min_world_size=ip.min_world_size or world,
        cuda_health_check=has_gpu,
        cpu_restart_health_check=replace,
    )

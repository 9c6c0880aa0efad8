"""NVRx's in-process restart as the workers use it: the ``Wrapper`` built from a plan, the steps
nvtrain hooks into it, the exception that interrupts an attempt, the hang-protection switch.

``worker/restart.py`` decides what happens at each step (keep or drop the save in flight, log
the restart); this module turns that into NVRx's classes and keyword arguments, and is the only
place that knows their names. The values come from ``config.wrapper_plan`` (``WrapperPlan``,
read here through :class:`Plan`, the attributes this module uses). NVRx is imported inside the
functions: ``import nvtrain.nvrx.inprocess`` is cheap.

A future NVRx may drop the deprecated ``inprocess`` package: :func:`available` says whether the
installed NVRx has it, without importing it.
"""

from __future__ import annotations

import datetime
import importlib.util
import inspect
from collections.abc import Callable, Collection
from typing import Any, Protocol, TypeVar

from nvtrain.nvrx.messages import PACKAGE

__all__ = [
    "INPROCESS",
    "MISSING_AT_FAULT",
    "Plan",
    "abort_step",
    "available",
    "build_wrapper",
    "finalize_step",
    "hang_switch",
    "has_restart_health_check",
    "interruption",
    "missing_note",
    "passing_call_wrapper",
    "use_restart_health_check",
    "wrapper_parameters",
]

INPROCESS = f"{PACKAGE}.inprocess"
"""NVRx's in-process restart package (deprecated upstream since 0.6)."""

MISSING_AT_FAULT = (
    f"no in-process restart with this NVRx ({INPROCESS} is missing): ft_launcher restarts the workers"
)
"""What a rank says of a soft fault when the installed NVRx has no in-process restart."""

T = TypeVar("T")


class Plan(Protocol):
    """What :func:`build_wrapper` reads of ``config.wrapper_plan.WrapperPlan``."""

    @property
    def soft_timeout(self) -> datetime.timedelta: ...
    @property
    def hard_timeout(self) -> datetime.timedelta: ...
    @property
    def barrier_timeout(self) -> datetime.timedelta: ...
    @property
    def heartbeat_timeout(self) -> datetime.timedelta: ...
    @property
    def heartbeat_interval(self) -> datetime.timedelta: ...
    @property
    def monitor_process_interval(self) -> datetime.timedelta: ...
    @property
    def monitor_thread_interval(self) -> datetime.timedelta | None: ...
    @property
    def max_iterations(self) -> int: ...
    @property
    def min_world_size(self) -> int | None: ...
    @property
    def last_call_wait(self) -> datetime.timedelta: ...
    @property
    def last_call_wait_passed(self) -> bool | None: ...
    @property
    def cuda_health_check(self) -> bool | None: ...


def available() -> bool:
    """Whether the installed NVRx has its in-process restart package (found, not imported)."""
    try:
        return importlib.util.find_spec(INPROCESS) is not None
    except (ImportError, ValueError):
        return False


def missing_note(where: str) -> str:
    """The line said when the policy asks for in-process restart and the installed NVRx has none
    (``where``: who says it, e.g. "this NVRx" or the version)."""
    return (
        f"{where} has no in-process restart ({INPROCESS} is missing): soft faults (exceptions, "
        "hangs) are restarted by ft_launcher in job instead; [restart.in_process] has no effect"
    )


def _module() -> Any:
    from nvidia_resiliency_ext import inprocess

    return inprocess


def wrapper_parameters() -> Collection[str]:
    """The keyword parameters the installed ``Wrapper`` takes."""
    return list(inspect.signature(_module().Wrapper).parameters)


def interruption() -> type[BaseException]:
    """The exception NVRx raises in the main thread to interrupt an attempt (a peer's fault, a
    detected hang)."""
    from nvidia_resiliency_ext.inprocess.monitor_thread import RankShouldRestart

    cls: type[BaseException] = RankShouldRestart
    return cls


def finalize_step(step: Callable[[Any], None]) -> Any:
    """NVRx's ``finalize`` that calls ``step(state)`` after an attempt ends and before the next
    one begins (NVRx's state of the restart: ``fn_exception``, ``iteration``)."""
    base: Any = _module().finalize.Finalize

    class _Finalize(base):  # type: ignore[misc]
        def __call__(self, state: Any) -> Any:
            step(state)
            return state

    return _Finalize()


def abort_step(before: Callable[[], None]) -> Any:
    """NVRx's ``abort`` that first runs ``before()`` (on NVRx's monitor thread, while the main
    thread may still be in a collective), then NVRx's own abort of torch.distributed."""
    inprocess = _module()
    abort_collectives = inprocess.abort.AbortTorchDistributed()  # NVRx's default abort
    base: Any = inprocess.abort.Abort

    class _Abort(base):  # type: ignore[misc]
        def __call__(self, state: Any) -> Any:
            before()
            return abort_collectives(state)

    return _Abort()


def build_wrapper(plan: Plan, *, abort: Any, finalize: Any) -> Any:
    """The ``Wrapper`` of the plan's values (each one's reason: ``config/wrapper_plan.py``)."""
    inprocess = _module()
    health = inprocess.health_check.CudaHealthCheck() if plan.cuda_health_check else None
    # [restart.in_process] failure_window is NVRx's last_call_wait where the Wrapper takes it.
    window = {"last_call_wait": plan.last_call_wait} if plan.last_call_wait_passed else {}
    return inprocess.Wrapper(
        **window,
        store_kwargs={"timeout": plan.barrier_timeout},
        initialize=inprocess.initialize.RetryController(
            max_iterations=plan.max_iterations, min_world_size=plan.min_world_size
        ),
        abort=abort,
        finalize=finalize,
        health_check=health,
        soft_timeout=plan.soft_timeout,
        hard_timeout=plan.hard_timeout,
        heartbeat_timeout=plan.heartbeat_timeout,
        barrier_timeout=plan.barrier_timeout,
        completion_timeout=plan.barrier_timeout,
        monitor_thread_interval=plan.monitor_thread_interval,
        monitor_process_interval=plan.monitor_process_interval,
        heartbeat_interval=plan.heartbeat_interval,
        progress_watchdog_interval=plan.heartbeat_interval,
    )


def has_restart_health_check(wrapper: Any) -> bool:
    """NVRx 0.6+: the ``Wrapper`` runs GPU, NVLink and NIC checks at every restart."""
    return hasattr(wrapper, "restart_health_check")


def use_restart_health_check(wrapper: Any) -> None:
    """Make the restart's checks the plain health check (without a GPU NVRx 0.6+'s own fail)."""
    wrapper.restart_health_check = wrapper.health_check


def passing_call_wrapper(attempt: Callable[[Any], T]) -> Callable[..., T]:
    """A function for ``Wrapper(...)`` that hands NVRx's ``CallWrapper`` to ``attempt``: NVRx
    passes it to the parameter annotated with its class."""

    def wrapped(call_wrapper: Any = None) -> T:
        return attempt(call_wrapper)

    wrapped.__annotations__["call_wrapper"] = _module().CallWrapper
    return wrapped


def hang_switch(call_wrapper: Any) -> tuple[Callable[[], None], Callable[[], None]] | None:
    """``(off, on)``: switch NVRx's in-process soft and hard timeouts off and back on for one
    stretch (``CallWrapper._disable_hang_protection`` / ``_enable_hang_protection``, NVRx 0.6
    and later); None where the installed NVRx has no such switch (0.4)."""
    off = getattr(call_wrapper, "_disable_hang_protection", None)
    on = getattr(call_wrapper, "_enable_hang_protection", None)
    if not callable(off) or not callable(on):
        return None
    return off, on

"""``run(main)``: the training function under NVRx in-process restart, configured by the policy.

NVRx's classes and keyword arguments are the boundary's (``nvtrain.nvrx.inprocess``); what
happens at each of its steps is decided here.

Per attempt: a fresh process group (its store prefixed with the attempt number), a fresh
``Context`` and ``Checkpointer``. On a soft fault every rank first gives the checkpoint in flight
a bounded time to finish (the failing rank on its way out of the training function, the others
in our abort step, before NVRx aborts the collectives), then drops it if it has not; the function
runs again and restores the newest committed checkpoint. Faults that kill the process are left to
ft_launcher.
"""

import contextlib
import datetime
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nvtrain import entry
from nvtrain.config.schema import Policy
from nvtrain.config.timeouts import settle_time
from nvtrain.config.wrapper_plan import WrapperFeatures, plan_wrapper
from nvtrain.events import EventLog
from nvtrain.events.records import (
    AttemptStart,
    RestartBegin,
    RestartEnd,
    WorkerGaveUp,
    WorkerStart,
    WorkerStopped,
    WorkerThreadError,
)
from nvtrain.nvrx import inprocess as nvrx_inprocess
from nvtrain.nvrx.messages import from_nvrx, gave_up_reason, restart_cause
from nvtrain.worker import inprocess_end, stopping
from nvtrain.worker.context import Context
from nvtrain.worker.faults import FaultInjector
from nvtrain.worker.gloo_cut import GlooLinks
from nvtrain.worker.heartbeat import KEEP_ALIVE_FALLBACK, Heartbeat
from nvtrain.worker.restore_ahead import warm_restore
from nvtrain.worker.settings import WorkerSettings, load_settings, say

__all__ = ["run"]

Main = Callable[[Context], Any]


class _Current:
    """The attempt in progress, so the abort step (another thread) can reach it."""

    context: Context | None = None
    links: GlooLinks | None = None
    """The attempt's gloo connections, cut when an in-process restart begins (``gloo_cut``)."""


def _backend(choice: str) -> str:
    if choice == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return choice


def _attempt(
    main: Main,
    settings: WorkerSettings,
    events: EventLog | None,
    heartbeat: Heartbeat,
    faults: FaultInjector,
    iteration: int,
    store: Any = None,
    call_wrapper: Any = None,
) -> Any:
    policy = settings.policy
    world = int(os.environ.get("WORLD_SIZE", "1"))
    timeout = datetime.timedelta(seconds=policy.job.collective_timeout)
    if _backend(policy.job.backend) == "nccl":
        _on_gpu(distributed=world > 1 or store is not None, first=iteration == 0)
    if world > 1 or store is not None:
        if store is not None:
            backend = _backend(policy.job.backend)
            # The stores' connections are never cut: MASTER_PORT (torch elastic's) and the one
            # above it (this layer's, ``base_store``), whose server rank 0 hosts.
            store_ports = (
                {int(os.environ["MASTER_PORT"]) + k for k in (0, 1)} if "MASTER_PORT" in os.environ else set()
            )
            with GlooLinks.noting(enabled=backend == "gloo", exclude_ports=store_ports) as links:
                dist.init_process_group(
                    backend,
                    store=store,
                    rank=int(os.environ["RANK"]),
                    world_size=world,
                    timeout=timeout,
                )
            _Current.links = links
        else:
            from nvtrain.worker import stores  # rank 0's store bound to MASTER_ADDR's address

            env_store = stores.env_store(timeout)
            if env_store is None:
                dist.init_process_group(_backend(policy.job.backend), timeout=timeout)
            else:  # env:// with that store: rank and world from the environment
                dist.init_process_group(
                    _backend(policy.job.backend),
                    store=env_store,
                    rank=int(os.environ["RANK"]),
                    world_size=world,
                    timeout=timeout,
                )
    run_dir = Path(policy.checkpoint.dir) / settings.run_id
    ctx = Context(
        policy=policy,
        run_id=settings.run_id,
        run_dir=run_dir,
        events=events,
        heartbeat=heartbeat,
        faults=faults,
        iteration=iteration,
        call_wrapper=call_wrapper,
    )
    _Current.context = ctx
    if events is not None:
        events.emit(
            AttemptStart(
                rank=ctx.rank, world=ctx.world_size, iteration=iteration, restart_count=ctx.restart_count
            )
        )
    try:
        result = main(ctx)
        ctx.finish()
        return result
    except BaseException:
        with contextlib.suppress(Exception):  # a fault after training_done(): no section any more
            ctx.end_section_after_training()
        # Nothing here may replace the fault on its way to NVRx (an unwritable events log, say).
        with contextlib.suppress(Exception):
            ctx.log_last_step()
        signum = stopping.requested()
        if signum is not None:  # SIGTERM: the save in flight first, then exit
            limit = stop_limit(policy, settings.events_path)
            # NVRx must not interrupt the wait: its abort takes the same lock.
            held = call_wrapper.atomic() if call_wrapper is not None else contextlib.nullcontext()
            with held, contextlib.suppress(Exception):
                ctx.settle(limit)
            # Out now: raising into NVRx would hold this rank at its exit barrier until every
            # peer arrives, and a dead peer never does.
            stopping.exit_now(signum)
        elif call_wrapper is not None:  # an in-process restart follows
            # Peers blocked in a gloo collective with this rank are freed now, not at its timeout.
            _cut_links()
            with contextlib.suppress(Exception):
                ctx.settle(settle_limit(policy))
            ctx.abort()
        raise
    finally:
        with contextlib.suppress(Exception):  # its last heartbeat may fail: the training is over
            ctx.end_section_after_training()
        _Current.context = None
        _Current.links = None
        if dist.is_initialized():
            dist.destroy_process_group()


def _on_gpu(*, distributed: bool, first: bool) -> None:
    """An attempt on NCCL: this rank's GPU is its local rank's; in a new process, the buffers a
    restore from the host copy reads through are made in the background meanwhile (a replacement
    worker's restore then finds them made: ``restore_ahead``)."""
    if distributed:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if first:
        warm_restore(int(os.environ.get("RANK", "0")))


def _cut_links() -> None:
    links = _Current.links
    if links is not None:
        with contextlib.suppress(Exception):
            links.cut()


def settle_limit(policy: Policy) -> float:
    """How long a soft fault waits for the checkpoint in flight: half the time between the soft
    and the hard timeout, so a hang detected at the soft timeout is restarted before the hard one
    (0 with ``[checkpoint] finish_in_flight = false``)."""
    if not policy.checkpoint.finish_in_flight:
        return 0.0
    ip = policy.restart.in_process
    return settle_time(ip.soft_timeout, ip.hard_timeout)


def stop_limit(policy: Policy, events_path: Path | None) -> float:
    """How long a worker stopped by SIGTERM waits for the save in flight: ``[job] stop_timeout``
    less a margin when the pod is stopping, the soft-fault wait when ft_launcher restarts the
    workers after a peer's failure (see :mod:`nvtrain.worker.stopping`)."""
    if not policy.checkpoint.finish_in_flight:
        return 0.0
    if stopping.pod_is_stopping(events_path):
        stop = policy.job.stop_timeout
        return max(0.0, stop - min(5.0, stop / 4))
    return settle_limit(policy)


def run(main: Main) -> Any:
    """Run ``main(ctx)`` with the recovery layers the policy asks for; returns its result."""
    from nvtrain.nvrx import logs as nvrx_logs  # NVRx's loggers set up before its Wrapper is built

    nvrx_logs.configure_worker()
    settings = load_settings()
    policy = settings.policy
    rank = int(os.environ.get("RANK", "0"))
    events = settings.events(rank=rank, host=socket.gethostname())
    hb = policy.heartbeat
    interval = hb.monitor_interval if hb.timeout is None else min(hb.monitor_interval, hb.timeout / 4)
    heartbeat = Heartbeat(settings.under_launcher, interval=interval)
    run_dir = Path(policy.checkpoint.dir) / settings.run_id
    faults = FaultInjector(policy.faults, run_dir / "faults", events)
    heartbeat.start(startup_limit=KEEP_ALIVE_FALLBACK if hb.initial_timeout is None else hb.initial_timeout)
    if events is not None:
        events.emit(
            WorkerStart(
                rank=rank,
                restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                warm=True if os.environ.get("NVTRAIN_PID") else None,
            )
        )

    def settle_for_stop(_signum: int) -> None:
        ctx = _Current.context
        if ctx is not None:
            ctx.settle(stop_limit(policy, settings.events_path))

    def stopped(signum: int, forced: bool, waited: float) -> None:
        if events is not None:
            events.emit(
                WorkerStopped(
                    rank=rank, signal=signal.Signals(signum).name, forced=forced, waited_s=round(waited, 3)
                )
            )

    stopping.install(on_stop=settle_for_stop, on_exit=stopped)
    _report_helper_thread_errors(events, rank)
    try:
        launched = "MASTER_ADDR" in os.environ and "RANK" in os.environ
        wanted = policy.restart.in_process.enabled and launched
        missing = wanted and not nvrx_inprocess.available()  # a future NVRx may drop it
        if wanted and not missing:
            # NVRx runs `while gc.collect(): pass` between attempts: with torch imported that is
            # 2 x 0.1-0.3 s of every in-process restart spent walking objects that live as long as
            # the process. Frozen now, they are skipped; what the attempts create is not frozen.
            entry.freeze()  # gc.freeze(), noting a file open for writing for the ending
            return _run_in_process(main, settings, events, heartbeat, faults)
        return _attempt(main, settings, events, heartbeat, faults, iteration=0)
    except BaseException as exc:
        _end(exc, rank, events, policy)
        if missing and isinstance(exc, Exception):
            say(
                f"{type(exc).__name__} in the training function; {nvrx_inprocess.MISSING_AT_FAULT}",
                prefix=f"nvtrain: rank {rank}: ",
            )
        raise  # not reached when the in-process layer gave up or a stop was requested
    finally:
        heartbeat.stop()


def _end(exc: BaseException, rank: int, events: EventLog | None, policy: Policy) -> None:
    """The way out of ``run`` on an exception: a requested stop exits as a stop; when NVRx's
    in-process layer gave up, one line (not a traceback) and exit 1 for the in-job layer to take
    over; any other exception returns, for ``run`` to raise."""
    signum = stopping.requested()
    if signum is not None:
        # Whatever ends the way out (NVRx may turn it into its own exception), a stop is a stop.
        stopping.exit_now(signum)
    reason = gave_up_reason(exc)
    if reason is None:
        return
    # The in-process layer gave up (a peer died and the world fell below min_world_size, or
    # its attempts ran out): the in-job layer takes over. One line, not a traceback.
    if events is not None:
        with contextlib.suppress(Exception):
            events.emit(WorkerGaveUp(rank=rank, reason=reason))
    say(
        f"in-process restart gave up ({reason}); ft_launcher restarts the workers",
        prefix=f"nvtrain: rank {rank}: ",
    )
    if "min_world_size" in reason:
        # A peer died: let ft_launcher see that first (its next look at the workers stops this
        # one too), so the run's root cause names the dead rank, not this survivor.
        with contextlib.suppress(stopping.Stopped):
            time.sleep(2 * min(policy.heartbeat.monitor_interval, 1.0) + 1.0)
        signum = stopping.requested()
        if signum is not None:
            stopping.exit_now(signum)
    stopping.exit_with(1)


def _report_helper_thread_errors(events: EventLog | None, rank: int) -> None:
    """An NVRx helper thread that dies (its store's host, rank 0, was killed by a hard fault and
    the next restart is under way) becomes one ``worker_thread_error`` event, not a traceback in
    the job's output. Threads of other libraries and of the script keep Python's report."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        thread = args.thread
        if thread is None or not from_nvrx(thread):
            previous(args)
            return
        if events is not None:
            with contextlib.suppress(Exception):
                events.emit(
                    WorkerThreadError(rank=rank, thread=thread.name, error=repr(args.exc_value)[:300])
                )

    threading.excepthook = hook


def _run_in_process(
    main: Main, settings: WorkerSettings, events: EventLog | None, heartbeat: Heartbeat, faults: FaultInjector
) -> Any:
    # The arguments, with the reasons for each value: config/wrapper_plan.py (`--dry-run` shows them).
    world = int(os.environ["WORLD_SIZE"])
    plan = plan_wrapper(
        settings.policy,
        world=world,
        has_gpu=torch.cuda.is_available(),
        features=WrapperFeatures.of(nvrx_inprocess.wrapper_parameters(), None),
    )
    assert plan.monitor_thread_interval is not None and plan.min_world_size is not None  # world known
    interrupted: list[str] = []  # the first interruption NVRx raised in this attempt, if any

    def drop_checkpoint(state: Any) -> None:
        """Between attempts: the save in flight is dropped, the restart logged."""
        ctx = _Current.context
        if ctx is not None:
            ctx.abort()
        if events is not None:
            rank = int(os.environ["RANK"])  # NVRx sets it anew when it assigns the ranks again
            cause, detail = restart_cause(getattr(state, "fn_exception", None), interrupted, rank)
            events.emit(
                RestartBegin(
                    layer="in_process",
                    rank=rank,
                    iteration=getattr(state, "iteration", None),
                    cause=cause,
                    detail=detail,
                )
            )
        interrupted.clear()

    def settle_first() -> None:
        """The healthy ranks' side of keeping the save in flight: wait for it before NVRx
        aborts the collectives.

        The last step is logged here too: a main thread blocked in a collective for longer than
        the soft timeout gets NVRx's interruption raised again and again once it returns, which
        can cut its own logging short; this (NVRx's monitor) thread is not interrupted."""
        # This rank's main thread, if blocked in a gloo collective, is freed first.
        _cut_links()
        ctx = _Current.context
        if ctx is not None:
            with contextlib.suppress(Exception):  # the abort must happen whatever
                ctx.log_last_step()
            with contextlib.suppress(Exception):
                ctx.settle(settle_limit(settings.policy))

    wrapper = nvrx_inprocess.build_wrapper(
        plan,
        abort=nvrx_inprocess.abort_step(settle_first),
        finalize=nvrx_inprocess.finalize_step(drop_checkpoint),
    )
    if plan.replaces_restart_health_check(nvrx_inprocess.has_restart_health_check(wrapper)):
        # NVRx 0.6+ adds GPU, NVLink and NIC checks to every restart; without a GPU they fail,
        # with one they stay.
        nvrx_inprocess.use_restart_health_check(wrapper)
    hosts = int(os.environ["RANK"]) == 0  # this process hosts the Wrapper's store and this one
    from nvtrain.worker import stores  # bound to MASTER_ADDR's address, NVRx's unpickling guarded

    base_store = stores.inprocess_base_store(world, hosts=hosts, timeout=plan.barrier_timeout)
    stores.guard_wrapper_store(wrapper)  # the Wrapper's own store (MASTER_PORT) bound the same way

    interruption = nvrx_inprocess.interruption()
    last: list[Any] = []  # the CallWrapper, kept (with the store it holds) until the monitors end

    def attempt(call_wrapper: Any) -> Any:
        last[:] = [call_wrapper]
        iteration = call_wrapper.iteration
        if iteration > 0 and events is not None:
            events.emit(
                RestartEnd(
                    layer="in_process",
                    rank=int(os.environ["RANK"]),
                    iteration=iteration,
                    ts_mono=time.monotonic(),
                )
            )
        store = dist.PrefixStore(  # type: ignore[attr-defined]
            f"nvtrain-attempt-{iteration}", base_store
        )
        try:
            return _attempt(
                main, settings, events, heartbeat, faults, iteration, store=store, call_wrapper=call_wrapper
            )
        except interruption as exc:  # NVRx interrupted this attempt
            if not interrupted:
                interrupted.append(str(exc))
            raise

    result = wrapper(nvrx_inprocess.passing_call_wrapper(attempt))()
    inprocess_end.finish(last[0] if last else None, base_store, hosts=hosts)
    return result

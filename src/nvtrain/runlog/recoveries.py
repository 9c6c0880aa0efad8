"""Recoveries: the faults and restarts before each first completed step of an attempt.

The faults and restarts (``kinds.is_fault``, ``kinds.is_restart``) before a first completed
step (a ``Step`` with no ``step_s``) form one ``Recovery``, from the earliest of them to that
step; those that no step followed form a last one that did not recover. One pass over the
events, and one over each recovery's own events.

A recovery's cause is told twice: ``cause`` in words for people (``RuntimeError: boom``,
``sigkill (injected)``), and ``cause_kind`` as one of the fixed ``CAUSES`` (a metrics label).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Literal

from nvtrain.events.records import (
    AttemptStart,
    CheckpointRestored,
    Event,
    FaultInjected,
    HangBlamed,
    HangDetected,
    LauncherExit,
    Relaunch,
    RendezvousDone,
    RestartBegin,
    RestartEnd,
    SignalReceived,
    Step,
    WorkerEnded,
    WorkerExit,
    WorkerFailed,
)
from nvtrain.runlog.kinds import RESTORE_ORIGINS, duration, is_fault, is_restart, restore_origin

__all__ = ["CAUSES", "Cause", "Layer", "Recovery", "find_recoveries"]

Layer = Literal["in_process", "in_job"]
"""How the workers came back from a fault: in the same processes, or in new ones."""

Cause = Literal[
    "exception",
    "hang",
    "sigkill",
    "oom",
    "sigterm",
    "signal",
    "exit",
    "stop",
    "launcher_failed",
    "lost_node",
    "unknown",
]
"""What a recovery answered, in one word (docs/report.md, "Metrics contract"): a worker
``exception``; a ``hang`` (a missed heartbeat, an in-process soft or hard timeout); a worker killed
by ``sigkill``, out of memory (``oom``: exit status 137, or an injected ``oom``), sent a ``sigterm``
or killed by another ``signal`` (SIGSEGV, SIGABRT...; NVRx's "terminated"); a worker that exited
with a non-zero code and nothing more is known (``exit``); ``nvtrain run`` told to ``stop`` (a
signal to the pod); a launcher that exited with an error (``launcher_failed``); a node lost (its
ft_launcher relaunched, or its pod restarted: ``lost_node``); ``unknown`` when nothing says."""
CAUSES: tuple[Cause, ...] = typing.get_args(Cause)
"""Every ``Cause``."""


@dataclasses.dataclass(frozen=True, slots=True)
class Recovery:
    """One fault (or restart) and the recovery from it. Times are unix times."""

    start: float
    """The earliest fault or restart it answers."""
    end: float | None
    """The first completed step after it; None when none followed (the run ended, or is still
    recovering)."""
    layer: Layer
    """``in_job`` when the workers came back in new processes (``restart_count`` rose, the
    launcher saw a worker fail, restarted in job or was relaunched, or the pod was restarted),
    else ``in_process``."""
    restarts: tuple[str, ...]
    """The layer of each restart (in_process, in_job, launcher, pod), once across ranks and
    nodes, oldest first."""
    cause: str
    """What it answered, for people: the exception, the signal, ``exit 1``, ``hang``..."""
    cause_kind: Cause
    """The same as one of ``CAUSES``."""
    fault_logged: bool
    """A fault (not only restarts) is among its events."""
    step: int | None
    """The step the fault fired at, when logged."""
    restore_s: float
    """Seconds of the slowest checkpoint load in it; 0 when none was loaded."""
    detected: float | None
    """Its first restart, else the launcher seeing a worker fail or hang; None unless it started
    at a logged fault (detection is measured only from one)."""
    torn_down: float | None
    """The last ``restart_end`` (in-process)."""
    rendezvous: float | None
    """The last ``rendezvous_done`` (in-job)."""
    attempt: float | None
    """The last ``attempt_start``."""
    restored: float | None
    """The last ``checkpoint_restored``."""
    restored_step: int | None
    """Its step."""
    restored_from: str | None
    """Where its loads read from (``kinds.restore_origin``), the slowest of them: ``storage``
    when any rank read storage, else ``peer`` when any rank (of a replaced pod) read another
    pod's host copy, else ``memory``; None when no load says."""

    @property
    def recovered(self) -> bool:
        return self.end is not None

    @property
    def seconds(self) -> float | None:
        """Fault to the first completed step (checkpoint load included); None when not recovered."""
        return None if self.end is None else self.end - self.start


def find_recoveries(events: Sequence[Event], pods: frozenset[int]) -> tuple[Recovery, ...]:
    """Every recovery in ``events`` (oldest first; ``pods``: their ``kinds.pod_restarts``),
    oldest first; only the last may be one that did not recover."""
    groups: list[tuple[int, int | None]] = []  # (its first fault or restart, the first step after)
    pending: int | None = None
    for i, e in enumerate(events):
        if pending is not None and isinstance(e, Step) and e.first_of_attempt:
            groups.append((pending, i))  # a fault at this step belongs to a later one
            pending = None
        if pending is None and (is_fault(e) or is_restart(e, pods)):
            pending = i
    if pending is not None:
        groups.append((pending, None))
    out = []
    highest: int | None = None  # the highest restart_count of the steps before a recovery
    seen = 0
    for start, end in groups:
        for e in events[seen:start]:
            if isinstance(e, Step) and e.restart_count is not None:
                highest = e.restart_count if highest is None else max(highest, e.restart_count)
        seen = max(seen, start)
        window = events[start : len(events) if end is None else end]
        out.append(_recovery(window, events[end] if end is not None else None, highest, pods))
    return tuple(out)


def _recovery(
    window: Sequence[Event], step: Event | None, highest_before: int | None, pods: frozenset[int]
) -> Recovery:
    """The recovery made of ``window`` (its first fault or restart up to the first completed
    ``step`` after it, when one followed)."""
    restored: CheckpointRestored | None = None
    restored_from: str | None = None
    torn_down = rendezvous = attempt = first_restart = first_failure = None
    loads: list[float] = []
    fault_step: int | None = None
    new_processes = fault_logged = False
    for k, e in enumerate(window):
        if isinstance(e, CheckpointRestored):
            restored = e
            restored_from = _slower(restored_from, restore_origin(e))
            if (seconds := duration(e.seconds)) is not None:
                loads.append(seconds)
        elif isinstance(e, RestartEnd):
            torn_down = e.ts
        elif isinstance(e, RendezvousDone):
            rendezvous = e.ts
        elif isinstance(e, AttemptStart):
            attempt = e.ts
        if first_failure is None and k > 0 and isinstance(e, (WorkerExit, HangDetected)):
            first_failure = e.ts
        fault, restart = is_fault(e), is_restart(e, pods)
        if not (fault or restart):
            continue
        fault_logged = fault_logged or fault
        if restart and first_restart is None:
            first_restart = e.ts
        if fault_step is None and isinstance(e, (FaultInjected, WorkerExit)):
            fault_step = e.step
        new_processes = new_processes or (
            isinstance(e, (WorkerExit, Relaunch))
            or (isinstance(e, RestartBegin) and not e.in_process)
            or id(e) in pods
        )
    count = step.restart_count if isinstance(step, Step) else None
    rose = count is not None and highest_before is not None and count > highest_before
    detected = first_restart if first_restart is not None else first_failure
    kind, cause = _cause(window, pods)
    return Recovery(
        start=window[0].ts,
        end=None if step is None else step.ts,
        layer="in_job" if rose or new_processes else "in_process",
        restarts=_restart_layers(window, pods),
        cause=cause,
        cause_kind=kind,
        fault_logged=fault_logged,
        step=fault_step,
        restore_s=max(loads, default=0.0),
        detected=detected if is_fault(window[0]) else None,
        torn_down=torn_down,
        rendezvous=rendezvous,
        attempt=attempt,
        restored=None if restored is None else restored.ts,
        restored_step=None if restored is None else restored.step,
        restored_from=restored_from,
    )


def _slower(a: str | None, b: str | None) -> str | None:
    """The slower of two origins (``kinds.RESTORE_ORIGINS``); one that is None gives the other."""
    if a is None or b is None:
        return a if b is None else b
    return max(a, b, key=RESTORE_ORIGINS.index)


def _restart_layers(window: Sequence[Event], pods: frozenset[int]) -> tuple[str, ...]:
    """The layer of each restart in ``window``, once across ranks and nodes, oldest first."""
    seen: set[tuple[object, ...]] = set()
    layers = []
    for e in window:
        if isinstance(e, RestartBegin):
            layer = e.layer or "in_job"
            round_ = e.iteration if layer == "in_process" else e.attempts_left
            key: tuple[object, ...] = (layer, round_) if round_ is not None else (layer, id(e))
        elif isinstance(e, Relaunch):
            layer, key = "launcher", ("launcher", e.node, e.attempt)
        elif id(e) in pods:
            layer, key = "pod", ("pod", id(e))
        else:
            continue
        if key not in seen:
            seen.add(key)
            layers.append(layer)
    return tuple(layers)


_INJECTED: dict[str, Cause] = {
    "exception": "exception",
    "hang": "hang",
    "collective_hang": "hang",
    "sigkill": "sigkill",
    "collective_sigkill": "sigkill",
    "oom": "oom",
    "sigterm": "sigterm",
}
"""``[[faults]] kind`` to its cause."""
_INTERRUPTIONS: dict[str, Cause] = {
    "exception": "exception",
    "base exception": "exception",
    "soft timeout": "hang",
    "hard timeout": "hang",
    "unresponsive": "hang",
    "terminated": "signal",
}
"""An in-process restart's cause (``nvrx.messages.restart_cause``: NVRx's interruption, in
words, ``peer `` in front on the ranks that only saw it) to its cause."""
OOM_EXIT = 137
"""Exit status of a worker ended by an out-of-memory kill when a shell or a container runtime
reports it (128 + SIGKILL), and of an injected ``oom``."""


def _signal_cause(name: str) -> Cause:
    return "sigkill" if name == "SIGKILL" else "sigterm" if name == "SIGTERM" else "signal"


def _exit_cause(failed: WorkerExit) -> Cause:
    """A failed worker, by what it logged: an exception (also when a signal ended it after its
    traceback: torch's threads can abort the interpreter's exit), a signal, or its exit code."""
    if failed.raised:
        return "exception"
    if failed.signal:
        return _signal_cause(failed.signal)
    return "oom" if failed.exit_code == OOM_EXIT else "exit"


def _hang_words(blamed: HangBlamed | None) -> str:
    """A hang in words, with the rank it was blamed on (``hang_blamed``) when one was."""
    if blamed is None:
        return "hang"
    if blamed.candidates:
        return f"hang (in one of local ranks {', '.join(str(r) for r in blamed.candidates)})"
    who = f"rank {blamed.rank}" if blamed.rank is not None else f"local rank {blamed.local_rank}"
    return f"hang ({who}, {blamed.state or 'stopped'})"


def _restart_cause(text: str) -> Cause:
    text = text.removeprefix("peer ")
    return _INTERRUPTIONS.get(text.partition(" (")[0], "unknown")


def _cause(window: Sequence[Event], pods: frozenset[int]) -> tuple[Cause, str]:
    """What ``window`` answered: one of ``CAUSES``, and in words."""
    injected = next((e for e in window if isinstance(e, FaultInjected)), None)
    if injected is not None:
        return _INJECTED.get(injected.kind or "", "unknown"), f"{injected.kind or 'fault'} (injected)"
    if any(isinstance(e, HangDetected) for e in window):
        blamed = next((e for e in window if isinstance(e, HangBlamed)), None)
        return "hang", _hang_words(blamed)
    # A worker killed by a signal (a failed one, not one that was told to stop: ``WorkerEnded``) is
    # the fault: the in-process restarts of its peers that follow name only what they saw of it
    # (a broken connection). One that raised before it was killed failed by its exception
    # (``_exit_cause``).
    signalled = (e for e in window if isinstance(e, WorkerFailed) and e.signal)
    killed = next((e for e in signalled if not e.raised), None)
    if killed is not None:
        return _signal_cause(str(killed.signal)), str(killed.signal)
    # An in-process restart names its cause; the failing rank's is the fault.
    causes = [e.cause for e in window if isinstance(e, RestartBegin) and e.cause]
    if causes:
        text = next((c for c in causes if not c.startswith("peer ")), causes[0])
        return _restart_cause(text), text
    failed = next((e for e in window if isinstance(e, WorkerFailed)), None)
    if failed is not None:
        return _exit_cause(failed), failed.signal or f"exit {failed.exit_code}"
    signal = next((e for e in window if isinstance(e, SignalReceived)), None)
    if signal is not None:
        return "stop", signal.signal or "signal"
    # A worker told to stop by something else than nvtrain (a SIGTERM to it from outside).
    ended = next((e for e in window if isinstance(e, WorkerEnded)), None)
    if ended is not None:
        return _exit_cause(ended), ended.signal or f"exit {ended.exit_code}"
    exited = next((e for e in window if isinstance(e, LauncherExit) and e.failed), None)
    if exited is not None:
        return "launcher_failed", f"launcher exit {exited.exit_code}"
    if any(isinstance(e, Relaunch) for e in window):
        return "lost_node", "launcher lost"
    if any(id(e) in pods for e in window):
        return "lost_node", "pod restarted"
    return "unknown", "no fault logged"

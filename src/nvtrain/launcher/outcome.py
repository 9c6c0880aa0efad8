"""How a run ended on this node: the exit code and the one-paragraph root cause.

``decide`` turns what the supervisor saw (signals, worker failures, ft_launcher's errors and
its exit code) into an ``Outcome``; ``write_termination_log`` puts the cause where Kubernetes
shows it (``kubectl describe pod``). Exit codes: see ``nvtrain.errors``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode, signal_exit_code
from nvtrain.events import Reporter
from nvtrain.events.records import HangBlamed, TerminationLogError, WorkerEnded, WorkerExit, WorkerFailed
from nvtrain.launcher.identity import Identity
from nvtrain.nvrx import NO_RESTART_EXIT_CODE, NvrxVersion

__all__ = [
    "TERMINATION_LOG",
    "TERMINATION_LOG_VAR",
    "Observed",
    "Outcome",
    "decide",
    "seconds",
    "termination_log_path",
    "write_termination_log",
]

TERMINATION_LOG = Path("/dev/termination-log")
"""Kubernetes' default ``terminationMessagePath``; written only when it exists (in a pod)."""
TERMINATION_LOG_VAR = "NVTRAIN_TERMINATION_LOG"
"""Names another file for the root cause (for a pod whose ``terminationMessagePath`` is not the
default); that file is written, created if need be, whether or not it exists."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How the run ended on this node."""

    exit_code: int
    cause: str


class Observed(Protocol):
    """What the supervisor saw during the run (``launcher.watch.Watch``); read-only here."""

    @property
    def signum(self) -> int | None:
        """The forwarded signal that stopped the run, if one did."""

    @property
    def escalated(self) -> str | None:
        """Why the run is a loop without progress, if it is."""

    @property
    def failures(self) -> Sequence[WorkerFailed]:
        """Worker failures on this node, first failure first."""

    @property
    def restarts(self) -> int:
        """In-job restarts so far."""

    @property
    def launcher_error(self) -> str | None:
        """The last ft_launcher's error message, if it ended with one."""

    @property
    def rendezvous_timeout(self) -> bool:
        """The last ft_launcher's error was a rendezvous that did not complete within join_timeout."""

    @property
    def world_nodes(self) -> int | None:
        """Nodes in the last completed rendezvous round, if one completed."""

    # Read when present (``Watch`` has them; an observer without them blames nothing):
    # ``escalated_error`` (str | None): the script's error when the run escalated;
    # ``escalated_early`` (bool): it escalated before ``escalate_after`` (an identical failure);
    # ``blames`` (Sequence[HangBlamed]): hangs blamed on a worker of this node, first first;
    # ``usage_error`` (str | None): ft_launcher refused its own command line;
    # ``worker_usage`` (str | None): a worker refused the script's call (``worker.refusal``);
    # ``ended`` (Sequence[WorkerEnded]): workers that ended after they were told to stop.


def seconds(value: float) -> str:
    """``5.0`` -> ``"5s"``, as durations are written in a policy."""
    return f"{value:g}s"


def decide(
    code: int,
    seen: Observed,
    policy: Policy,
    identity: Identity,
    endpoint: str,
    nvrx: NvrxVersion | None,
    *,
    storage: str | None = None,
) -> Outcome:
    """The exit code of ``nvtrain run`` and its cause, from ft_launcher's exit ``code``.

    ``storage``: a problem with the checkpoint volume still current when the run ended (saves
    or events that could not be written); a run that fails names it in its cause."""
    refused: str | None = getattr(seen, "worker_usage", None)
    if refused and seen.signum is None:
        # A worker refused the script's call (worker.refusal): every attempt would do the same.
        where = f"pod {identity.hostname} (node {identity.node_rank})"
        return Outcome(
            int(ExitCode.USAGE),
            f"usage error on {where}: {refused}; not retrying: fix the script, then start again",
        )
    outcome = _decide(code, seen, policy, identity, endpoint, nvrx)
    if storage and outcome.exit_code != ExitCode.OK and seen.signum is None:
        volume = f"[checkpoint] dir = {json.dumps(policy.checkpoint.dir)}"
        return Outcome(outcome.exit_code, f"{outcome.cause}. Checkpoint volume ({volume}): {storage}")
    return outcome


def _decide(
    code: int,
    seen: Observed,
    policy: Policy,
    identity: Identity,
    endpoint: str,
    nvrx: NvrxVersion | None,
) -> Outcome:
    where = f"pod {identity.hostname} (node {identity.node_rank})"
    if seen.signum is not None:
        name = signal.Signals(seen.signum).name
        return Outcome(
            signal_exit_code(seen.signum),
            f"stopped by {name} on {where}; the workers were asked to stop first",
        )
    if seen.escalated:
        error: str | None = getattr(seen, "escalated_error", None)
        early = bool(getattr(seen, "escalated_early", False))
        limit = f"[restart] escalate_after = {policy.restart.escalate_after}"
        if early:
            why = f"an error at start-up that repeats exactly stops the run before {limit}"
        else:
            why = f"no progress ({limit})" + (f"; the script's error: {error}" if error else "")
        return Outcome(
            int(ExitCode.ESCALATED),
            f"escalation on {where}: {seen.escalated}, {why}; not retrying: fix the cause, then "
            "start a new run",
        )
    if code == 0:
        return Outcome(int(ExitCode.OK), f"run {identity.run_id} finished on {where}")
    usage: str | None = getattr(seen, "usage_error", None)
    if usage:
        # A flag nvtrain passed on that this NVRx does not take: retrying cannot help.
        return Outcome(
            int(ExitCode.USAGE),
            f"{usage} (on {where}); fix the flag or the policy key behind it, then start again",
        )
    first = _first_failure(seen, where)
    earlier = f". Before that: {first}" if first else ""
    if nvrx is not None and nvrx.is_no_restart_exit(code):
        return Outcome(
            int(ExitCode.ESCALATED),
            f"NVRx {nvrx} ended the run on {where} with exit code {NO_RESTART_EXIT_CODE}: it "
            "decided not to restart again (its progress tracker saw no training progress over "
            f"several restarts; {seen.restarts} in-job restarts used){earlier}; not retrying: "
            "fix the cause, then start a new run",
        )
    if seen.rendezvous_timeout:
        cause = _rendezvous_timeout(seen, policy, identity, endpoint, where)
        return Outcome(int(ExitCode.RENDEZVOUS), cause + earlier)
    budget = policy.restart.in_job.max_restarts
    root = _root_failure(seen)
    blame = _root_blame(seen, root)
    if root is not None and blame is not None:
        cause = (
            f"workers failed; {seen.restarts}/{budget} in-job restarts used. Root cause "
            f"(first failure): {_blamed(blame, where)}. The first failure seen: {first}; {_in_all(seen)}"
        )
    elif root is not None:
        cause = (
            f"workers failed; {seen.restarts}/{budget} in-job restarts used. Root cause "
            f"(first failure): {first}; {_in_all(seen)}"
        )
        if root.signal == "SIGKILL" and not root.hang:
            cause += (
                ". SIGKILL often means the OOM killer: look for OOMKilled in "
                f"`kubectl describe pod {identity.hostname}`"
            )
    elif seen.launcher_error:
        cause = f"ft_launcher failed on {where}: {seen.launcher_error}"
    else:
        cause = f"ft_launcher exited with code {code} on {where}; see its log above"
    return Outcome(int(ExitCode.FAILED), cause)


def _root_failure(seen: Observed) -> WorkerExit | None:
    """The run's first worker failure; when no worker failed, the first worker that ended after
    it was told to stop. ``failures`` are in the order the workers failed: a rank that raised
    before the worker ft_launcher named comes first (``Watch``)."""
    if seen.failures:
        return seen.failures[0]
    ended: Sequence[WorkerEnded] = getattr(seen, "ended", ())
    return ended[0] if ended else None


def _in_all(seen: Observed) -> str:
    """How many workers failed (and ended on request), in words."""
    ended = len(getattr(seen, "ended", ()))
    told = f", {ended} more ended when told to stop" if ended else ""
    return f"{len(seen.failures)} worker failure(s) in all{told}"


def _blame(seen: Observed) -> HangBlamed | None:
    """The first hang blamed on a worker of this node, if the observer blamed one."""
    blames = getattr(seen, "blames", ())
    return blames[0] if blames else None


def _root_blame(seen: Observed, root: WorkerExit | None) -> HangBlamed | None:
    """The blamed hang, when it is the root failure: ``root`` is a hang, or the blamed worker's
    own end."""
    blame = _blame(seen) if root is not None else None
    if root is None or blame is None or root.hang or _ended_by_blame(root, blame):
        return blame
    return None


def _ended_by_blame(failure: WorkerExit, blame: HangBlamed) -> bool:
    """``failure`` is the end of the worker the hang was blamed on (the SIGKILL nvtrain sent it
    when it found it stopped): ft_launcher may report it before the failure of the peer whose
    rank monitor fired, and then it is still the hang that came first."""
    if blame.signal is None:
        return False
    if blame.worker_pid is not None and failure.worker_pid == blame.worker_pid:
        return True
    return blame.local_rank is not None and failure.local_rank == blame.local_rank


def _blamed(blame: HangBlamed, where: str) -> str:
    """A blamed hang in words."""
    if blame.candidates:
        ranks = ", ".join(str(r) for r in blame.candidates)
        return (
            f"a hang in one of local ranks {ranks} on {where} (or in a rank of another node they "
            "wait for): no worker process was stopped, and a rank blocked in a collective misses "
            "its heartbeats as surely as the rank it waits for, so the rank whose monitor fired "
            "first may be a healthy one"
        )
    if blame.local_rank is not None:
        who = f"local rank {blame.local_rank}"
        if blame.rank not in (None, blame.local_rank):
            who += f" (global rank {blame.rank})"
    elif blame.rank is not None:
        who = f"rank {blame.rank}"
    else:
        who = "a worker"
    pid = f" (pid {blame.worker_pid})" if blame.worker_pid is not None else ""
    how = f" and ended with {blame.signal}" if blame.signal else ""
    return (
        f"a hang in {who} on {where}{pid}: its process was {blame.state or 'stopped'} (SIGSTOP or "
        f"a debugger) and ran nothing; it was found so{how}. Ranks waiting for it in a "
        "collective missed their heartbeats too"
    )


def _first_failure(seen: Observed, where: str) -> str:
    """The root failure (``_root_failure``) in words ("" when no worker failed)."""
    first = _root_failure(seen)
    if first is None:
        return ""
    if first.signal:
        how = f"killed by {first.signal}"
        if first.raised:  # e.g. "terminate called without an active exception" at its exit
            how += f" after it raised {first.raised}"
    elif first.exit_code is not None:
        how = f"exit code {first.exit_code}"
        if first.raised:
            how += f" after it raised {first.raised}"
    else:
        how = f"raised {first.raised}" if first.raised else "exit code unknown"
    if first.hang:
        how += " after its heartbeats stopped (hang detected by the rank monitor)"
    if first.gave_up:
        how += f" after its in-process restart gave up ({first.gave_up})"
    if isinstance(first, WorkerEnded):
        how += " after it was told to stop"
    pid = f" (pid {first.worker_pid})" if first.worker_pid is not None else ""
    if first.local_rank is None and first.rank is not None:
        return f"rank {first.rank} on {where}, {how}{pid}"
    rank = f" (global rank {first.rank})" if first.rank not in (None, first.local_rank) else ""
    return f"local rank {first.local_rank}{rank} on {where}, {how}{pid}"


def _rendezvous_timeout(seen: Observed, policy: Policy, identity: Identity, endpoint: str, where: str) -> str:
    r = policy.rendezvous
    need = policy.min_nodes
    wanted = f"{need} node(s)" if need == r.nodes else f"at least {need} of {r.nodes} node(s)"
    joined = "this node joined, and NVRx does not log how many others did"
    if seen.world_nodes is not None:
        joined = f"the last completed round had {seen.world_nodes} node(s); in this one, {joined}"
    port = endpoint.rsplit(":", 1)[-1]
    control = r.store == "control" and not identity.standalone
    named = f"rendezvous id {policy.job.name}" if control else f"run id {identity.run_id}"
    if control:
        joined += "; the store is the control pod's (`nvtrain control`): check that it runs"
    return (
        f"rendezvous not completed in time on {where}: the rendezvous at {endpoint} ({named}) "
        f"needs {wanted} and did not get them within [rendezvous] "
        f"join_timeout = {seconds(r.join_timeout)}; {joined}. Likely causes: the other pods are "
        "not scheduled or not running yet (`kubectl get pods`: Pending for lack of nodes, GPUs "
        f"or quota); a NetworkPolicy or firewall blocks TCP port {port} between the pods; or "
        "the pods run with different run ids (NVTRAIN_RUN_ID). Exit 3 lets Kubernetes start the "
        "pod again; raise [rendezvous] join_timeout if the pods start far apart"
    )


def termination_log_path() -> tuple[Path, bool]:
    """Where the root cause goes, and whether to write it there even if the file is missing."""
    custom = os.environ.get(TERMINATION_LOG_VAR, "").strip()
    return (Path(custom), True) if custom else (TERMINATION_LOG, False)


def write_termination_log(text: str, report: Reporter) -> None:
    """Write the root cause for Kubernetes; a named file that cannot be written is reported."""
    path, always = termination_log_path()
    if not (always or path.exists()):
        return
    try:
        path.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        if always:
            error = exc.strerror or str(exc)
            report(TerminationLogError(path=str(path), error=error, variable=TERMINATION_LOG_VAR))

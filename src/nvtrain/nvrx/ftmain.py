"""ft_launcher as ``nvtrain run`` starts it:
``python -m nvtrain.nvrx.ftmain nvidia_resiliency_ext.fault_tolerance.launcher ARGS``.

The same program as ``python -m nvidia_resiliency_ext.fault_tolerance.launcher ARGS`` (NVRx's
own module and ``main()``, same arguments, same exit codes), with three fixed waits of the
launcher process replaced by waits that end when what they wait for has happened. Nothing of
NVRx is copied: each change wraps one of its functions, is made only where the NVRx in use has
the exact function it expects, and leaves NVRx as it is otherwise (``tune`` says what it did).

- **A worker's exit is seen when it happens** (every version). ft_launcher's monitor loop sleeps
  ``--monitor-interval`` between looks at its workers; here that sleep also ends when one of the
  launcher's child processes exits (a pidfd per child becomes readable). Detection of a dead
  worker no longer waits for the next tick; hangs keep their own timeouts.
- **No fixed second after stopping the workers** (0.6 and later). NVRx's clean-up of orphans in
  the workers' process groups sends SIGTERM, sleeps one second, then SIGKILL, on every restart
  and at the end of every run. Here it sends SIGTERM and waits at most that second for the
  groups to be empty, then SIGKILLs what is left.
- **No fixed second before joining the next round** (0.6 and later, barrier rendezvous). A
  launcher that restarts its workers enters the round's wait with its round counter one behind;
  NVRx's wait then syncs the counter, but sleeps one second before it looks again. Here the
  counter is synced before the wait (what its first pass does anyway), so an open round is
  joined at once. Hot spares and nodes waiting for a round that is not open yet poll as before.
- **No exit grace when no other node can read the store** (0.7, one node). The launcher that
  hosts the rendezvous store waits 3 s before it exits, so that other nodes can read the store's
  final state; in a job of one node (``--nnodes=1:1``) there is no other node, and that wait is
  skipped.

**Only on a release whose contract holds** (``nvtrain.nvrx.contracts``, ``docs/nvrx.md``).
Before it patches, ftmain checks the facts each speed-up relies on (the names, signatures and
calls recorded for the installed release line) on the imported modules, in about a
millisecond. A speed-up whose facts do not hold is left out; on a release line nvtrain was
never tested on, all are. Either way the launcher's log gets one WARNING line that names the
speed-ups left out and why, and ft_launcher runs as NVRx ships it otherwise.

``NVTRAIN_FT_TUNING=off`` in ``nvtrain run``'s environment runs ft_launcher untouched, but for
the rendezvous store's guards (``nvtrain.nvrx.storeguard``: where it listens, who may reach
it, what of it is unpickled), which are made in every case.

**The script's arguments never reach ft_launcher's parser** (every version, tuned or not). Its
argparse sees every word of its command line, the script's too, and reads a word that
abbreviates one of its options as that option (NVRx 0.4: ``--workers 4`` is "ambiguous option:
--workers could match --workers-stop-timeout"). Here the command line is cut after the
entrypoint (``-m nvtrain.entry SCRIPT`` or ``-m nvtrain.zygote.client -m MODULE``,
:func:`split_script_args`); ft_launcher parses the first part, and the rest is appended, word
for word, to the arguments it passes to its workers. An error of ft_launcher's parser (its own
options: an NVRx that lacks one) ends the program with exit 2 (argparse's) and one line,
``nvtrain ftmain: usage error: ft_launcher refused its command line: <argparse's error>``, in
place of argparse's usage text (which lists ft_launcher's options, not ``nvtrain run``'s).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import inspect
import io
import os
import select
import signal
import socket
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvtrain.nvrx import TESTED, NvrxVersion, installed_nvrx

__all__ = [
    "ENTRY_MODULES",
    "TUNING_ENV",
    "USAGE_ERROR",
    "ChildExits",
    "main",
    "monitor_interval",
    "one_node",
    "option",
    "prompt_group_cleanup",
    "speedups_off",
    "split_script_args",
    "tune",
]

LAUNCHER = "nvidia_resiliency_ext.fault_tolerance.launcher"
BARRIER = "nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier"
ENTRY_MODULES = ("nvtrain.entry", "nvtrain.zygote.client")
"""nvtrain's entrypoints in ft_launcher's command line (``-m MODULE``), each followed by the
script (``SCRIPT`` or ``-m MODULE``) and then the script's arguments."""
USAGE_ERROR = "nvtrain ftmain: usage error:"
"""How the line that repeats an error of ft_launcher's parser begins."""
GROUP_GRACE = 1.0
"""At most this long after SIGTERM before the workers' process groups get SIGKILL (NVRx's
fixed wait)."""


class ChildExits:
    """Waits that end early when a child process of this one exits (pidfds, Linux 5.3+)."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}
        """Child pid -> its pidfd."""
        self.ended: set[int] = set()
        """Children whose exit an earlier wait has seen already (not yet reaped)."""

    def children(self) -> set[int]:
        pids: set[int] = set()
        with contextlib.suppress(OSError):
            for task in os.listdir("/proc/self/task"):
                with contextlib.suppress(OSError):
                    text = Path(f"/proc/self/task/{task}/children").read_text(encoding="ascii")
                    pids.update(int(word) for word in text.split())
        return pids

    def _refresh(self) -> None:
        live = self.children()
        for pid in [p for p in self.fds if p not in live]:
            os.close(self.fds.pop(pid))
            self.ended.discard(pid)
        for pid in live - set(self.fds):
            with contextlib.suppress(OSError):
                self.fds[pid] = os.pidfd_open(pid)

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds``, or less when a child exits meanwhile (True then). A child that had
        ended before (seen by an earlier wait, not reaped yet) does not end the wait again."""
        try:
            self._refresh()
        except OSError:
            time.sleep(seconds)
            return False
        poller = select.poll()
        for pid, fd in self.fds.items():
            if pid not in self.ended:
                poller.register(fd, select.POLLIN)
        ready = poller.poll(max(0.0, seconds) * 1000)
        if not ready:
            return False
        by_fd = {fd: pid for pid, fd in self.fds.items()}
        self.ended.update(by_fd[fd] for fd, _ in ready if fd in by_fd)
        return True


EXIT_GRACE = "_wait_grace"
"""The function in which NVRx 0.7's store host waits before it exits (see the module's text)."""


class _Clock(types.ModuleType):
    """The ``time`` module as NVRx's launcher sees it: ``sleep(monitor_interval)`` is a
    :class:`ChildExits` wait, the store host's exit grace is skipped in a job of one node
    (``alone``), every other name is the real module's."""

    def __init__(self, interval: float, exits: ChildExits, alone: bool) -> None:
        super().__init__("time")
        self._interval = interval
        self._exits = exits
        self._alone = alone

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        if seconds == self._interval and seconds > 0:
            self._exits.wait(seconds)
        elif self._alone and sys._getframe(1).f_code.co_name == EXIT_GRACE:
            return
        else:
            time.sleep(seconds)


def split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """ft_launcher's arguments cut after nvtrain's entrypoint and its target: (what its parser
    reads, the script's arguments). ``nvtrain.launcher.plan`` writes each of ft_launcher's own
    options as one word (``--name=value``), so the first ``-m`` followed by one of
    ``ENTRY_MODULES`` starts the entrypoint. (argv, []) when there is none."""
    for k, word in enumerate(argv[:-2]):
        if word == "-m" and argv[k + 1] in ENTRY_MODULES:
            end = k + (4 if argv[k + 2] == "-m" else 3)
            if end <= len(argv):
                return argv[:end], argv[end:]
            break
    return argv, []


def _with_script_args(parse: Callable[..., Any], script_args: list[str]) -> Callable[..., Any]:
    """ft_launcher's ``parse_args``, with ``script_args`` appended to the worker's arguments it
    reads (``training_script_args``), and its usage errors repeated on one line."""

    def parse_args(*args: Any, **kwargs: Any) -> Any:
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                parsed = parse(*args, **kwargs)
        except SystemExit as exc:
            text = said.getvalue()
            if exc.code in (0, None):
                sys.stderr.write(text)
                raise
            # argparse's usage is ft_launcher's, not the user's: only its error line is shown.
            errors = [line.partition(": error: ")[2] for line in text.splitlines() if ": error: " in line]
            why = errors[-1] if errors else text.strip() or f"exit code {exc.code}"
            sys.stderr.write(f"{USAGE_ERROR} ft_launcher refused its command line: {why}\n")
            sys.stderr.flush()
            raise SystemExit(2) from None
        sys.stderr.write(said.getvalue())
        if script_args:
            parsed.training_script_args = [*getattr(parsed, "training_script_args", []), *script_args]
        return parsed

    parse_args.__wrapped__ = parse  # type: ignore[attr-defined]
    return parse_args


def option(argv: list[str], *flags: str) -> str | None:
    """The value of the first of ``flags`` in ft_launcher's arguments (``=`` or the next word)."""
    for k, word in enumerate(argv):
        for flag in flags:
            if word.startswith(flag + "="):
                return word.partition("=")[2]
            if word == flag and k + 1 < len(argv):
                return argv[k + 1]
    return None


def monitor_interval(argv: list[str]) -> float | None:
    """``--monitor-interval``'s value in ft_launcher's arguments."""
    value = option(argv, "--monitor-interval", "--monitor_interval")
    with contextlib.suppress(TypeError, ValueError):
        return float(value)  # type: ignore[arg-type]
    return None


def one_node(argv: list[str]) -> bool:
    """Whether ``--nnodes`` allows one node at most (``1`` or ``1:1``)."""
    value = option(argv, "--nnodes")
    return value is not None and value.strip().split(":")[-1] == "1"


def _groups_alive(pgids: set[int]) -> set[int]:
    alive = set()
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            continue
        except OSError:
            pass
        alive.add(pgid)
    return alive


def prompt_group_cleanup(allowed_pgids: set[int]) -> None:
    """NVRx 0.6+'s ``terminate_mp_processes(allowed_pgids)``, without its fixed second: SIGTERM
    to each group, at most ``GROUP_GRACE`` seconds for them to be empty, SIGKILL to the rest.
    Never raises (a clean-up of leftovers)."""
    pgids = set(allowed_pgids)
    if 1 in pgids or not pgids:  # NVRx's own guard (simulated nodes whose monitors have pgid 1)
        return
    for pgid in pgids:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GROUP_GRACE
    alive = _groups_alive(pgids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.01)
        alive = _groups_alive(alive)
    for pgid in alive:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)


def _params(function: Any) -> list[str] | None:
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None


def _synced_first(wait: Callable[..., Any]) -> Callable[..., Any]:
    def wait_for_open_round(self: Any, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):  # the wait's own first pass does it again
            self._sync_from_per_round_state()
        return wait(self, *args, **kwargs)

    wait_for_open_round.__wrapped__ = wait  # type: ignore[attr-defined]
    return wait_for_open_round


def speedups_off(version: NvrxVersion | None) -> tuple[frozenset[str], str | None]:
    """The speed-ups (``contracts.SPEEDUPS``) to leave out with the NVRx imported here, and the
    line that says which and why (None when none is left out)."""
    from nvtrain.nvrx import contracts
    from nvtrain.nvrx.contracts.live import broken_live

    contract = contracts.contract_for(version)
    if contract is None:
        what = f"NVRx {version}" if version is not None else "an NVRx without a version"
        return frozenset(contracts.SPEEDUPS), (
            f"nvtrain ftmain: {what} is not a tested release (tested: {', '.join(TESTED)}): "
            f"ft_launcher runs as shipped, without its speed-ups ({'; '.join(contracts.SPEEDUPS)})"
        )
    facts = [fact for fact in contract.facts if fact.uses in contracts.SPEEDUPS]
    broken = broken_live(facts)
    if not broken:
        return frozenset(), None
    off = frozenset(fact.uses for fact, _ in broken)
    whys = "; ".join(f"{fact}: {why}" for fact, why in broken)
    named = "; ".join(name for name in contracts.SPEEDUPS if name in off)
    return off, (
        f"nvtrain ftmain: speed-ups off ({named}): NVRx {version} breaks the contract of "
        f"{contract.version} ({whys}); ft_launcher runs without them"
    )


def tune(
    launcher: types.ModuleType,
    version: NvrxVersion | None,
    argv: list[str],
    off: frozenset[str] = frozenset(),
) -> list[str]:
    """Make the changes this NVRx allows in the imported ``launcher`` module (and its barrier
    rendezvous) for ft_launcher's arguments ``argv``, but those named in ``off``
    (:func:`speedups_off`); returns what was changed, for the log."""
    from nvtrain.nvrx.contracts.facts import CLEANUP, GRACE, MONITOR, ROUND

    done = []
    clock, interval = getattr(launcher, "time", None), monitor_interval(argv)
    usable = interval is not None and interval > 0 and isinstance(clock, types.ModuleType)
    if usable and MONITOR not in off:
        assert interval is not None
        alone = one_node(argv) and version is not None and version.barrier_rendezvous and GRACE not in off
        launcher.time = _Clock(interval, ChildExits(), alone)  # type: ignore[attr-defined]
        done.append(MONITOR)
        if alone:
            done.append(GRACE)
    if version is None or not version.barrier_rendezvous:
        return done
    cleanup = getattr(launcher, "terminate_mp_processes", None)
    if CLEANUP not in off and callable(cleanup) and _params(cleanup) == ["allowed_pgids"]:
        launcher.terminate_mp_processes = prompt_group_cleanup  # type: ignore[attr-defined]
        done.append(CLEANUP)
    if ROUND in off:
        return done
    try:
        barrier = importlib.import_module(BARRIER)
    except ImportError:
        return done
    state = getattr(barrier, "_RendezvousBarrierState", None)
    wait = getattr(state, "_wait_for_rendezvous_open", None)
    if state is not None and callable(wait) and callable(getattr(state, "_sync_from_per_round_state", None)):
        state._wait_for_rendezvous_open = _synced_first(wait)
        done.append(ROUND)
    return done


def _log(message: str, level: str = "INFO") -> None:
    """One INFO record in ft_launcher's own line format (NVRx 0.4's), so that ``nvtrain run``
    files it with the launcher's records: in ``launcher-node<N>.log``, on the terminal with -v."""
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d %H:%M:%S,") + f"{now.microsecond // 1000:03d}"
    sys.stderr.write(f"[{stamp}] [{level}] [ft_launcher{os.getpid()}@{socket.gethostname()}] {message}\n")
    sys.stderr.flush()


TUNING_ENV = "NVTRAIN_FT_TUNING"
"""``off``: ft_launcher runs as NVRx ships it."""


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] != LAUNCHER:
        sys.exit(f"usage: python -m nvtrain.nvrx.ftmain {LAUNCHER} [ft_launcher's arguments]")
    from nvtrain.nvrx import logs  # the checks of hardware this node lacks stay quiet

    logs.configure_launcher()
    launcher = importlib.import_module(LAUNCHER)
    argv, script_args = split_script_args(sys.argv[2:])
    parse = getattr(launcher, "parse_args", None)
    if callable(parse):
        launcher.parse_args = _with_script_args(parse, script_args)  # type: ignore[attr-defined]
    else:  # no parser to wrap: ft_launcher reads the whole command line, as shipped
        argv, script_args = [*argv, *script_args], []
    # The store's guards (nvtrain.nvrx.storeguard) are made tuned or not: they are security.
    from nvtrain.nvrx import storeguard

    guarded = storeguard.install(log=_log)
    _log(f"nvtrain ftmain: {'; '.join(guarded) or 'store as shipped (no guard applies to this NVRx)'}")
    if os.environ.get(TUNING_ENV, "").lower() not in ("off", "0", "false", "no"):
        version = installed_nvrx()
        off, why = speedups_off(version)
        if why is not None:
            _log(why, "WARNING")
        done = tune(launcher, version, argv, off) if version is not None and version.tested else []
        _log(f"nvtrain ftmain: {'; '.join(done) or 'as shipped'}")
    sys.argv = [str(launcher.__file__), *argv]
    # ft_launcher ends as nvtrain's workers do (``nvtrain.entry``): threads joined, atexit
    # handlers run, files flushed, the same exit code, then ``os._exit``: the interpreter's
    # finalization with torch imported cost 0.3 s (up to 1 s loaded) after its last line.
    from nvtrain import entry

    entry.finish(entry.call(launcher.main))


if __name__ == "__main__":
    main()

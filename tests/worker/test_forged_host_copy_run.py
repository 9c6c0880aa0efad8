"""A forged host copy is refused in a real run: 2 ranks (gloo, FSDP2 demo) under ``nvtrain run`` and
the real ft_launcher, async checkpoints with the host copy in /dev/shm, cold and warm-started.

While both workers are stopped (SIGSTOP: no newer save can land), an attacker with the same uid
but without the run's key replaces both ranks' host copies of the newest committed step N: the
extra file by a pickle that would create a marker file, the hashes and the header's MAC made with
a key of the attacker's. Rank 0's worker is then SIGKILLed; ft_launcher restarts the group, whose
replacements restore. The run must end with exit 0 and the marker must never exist: both ranks
restore step N from storage (``origin`` "storage"), saying that the copy's MAC does not verify,
and every step the replacements replay gives the loss the first attempt printed for it.

The worker processes are found by the pid the demo prints (``DEMO rank R/2 starts ... pid P``):
cold, a ``python -m nvtrain.entry`` child of ft_launcher; warm, a process forked by the
warm-start server (its ``python -m nvtrain.zygote.client`` only stands in for it, and a SIGSTOP
sent to the client would stop the client alone). Every wait is on files, events or process
states, bounded by a deadline.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from support.forgery import Marker, forge_copy, pickled
from support.proc_helpers import NvtrainRunner, Running, make_policy, read_events, write_policy
from support.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(480),
    # The forged pickle is made with torch.save: torch's pynvml shim warns on import.
    pytest.mark.filterwarnings("ignore:The pynvml package is deprecated:FutureWarning"),
]

STEPS = 40
INTERVAL = 5
DEADLINE = 240.0
"""Seconds for each phase (a committed, sealed step to forge; the run's end) on a loaded machine."""

STARTS = re.compile(r"DEMO rank (\d)/2 starts at step \d+ \(attempt \d+, restart (\d+), pid (\d+)\)")
LOSS = re.compile(r"DEMO step (\d+)/\d+ loss (-?\d+\.\d+)")
FINGERPRINT = re.compile(r"DEMO rank (\d) finished fingerprint ([0-9a-f]{16})")


def _policy(tmp_path: Path, warm: bool) -> Path:
    path, tables = make_policy(
        tmp_path,
        module="nvtrain.demo",
        args=["--steps", str(STEPS), "--step-time", "0.2", "--log-every", "1"],
        nproc=2,
        max_restarts=2,
        stop_timeout="10s",
        # The workers stay stopped while the copies are forged: no heartbeat timeout meanwhile.
        heartbeat={"initial_timeout": "180s", "timeout": "90s"},
        warm_start=warm,
    )
    tables["job"].update({"max_steps": STEPS, "backend": "gloo"})
    tables["checkpoint"].update({"interval": INTERVAL, "async": True, "keep": 2})
    return write_policy(tmp_path, tables)


def _committed(run_dir: Path) -> list[int]:
    found = []
    for entry in run_dir.glob("step-*"):
        match = re.fullmatch(r"step-(\d{6})", entry.name)
        if match and (entry / "COMMITTED").is_file():
            found.append(int(match.group(1)))
    return sorted(found)


def _header(copies: Path, rank: int, step: int) -> Path | None:
    """The header of ``rank``'s sealed copy of ``step``, if one is there."""
    for path in sorted(copies.glob(f"rank{rank}.slot*.json")):
        try:
            if json.loads(path.read_text(encoding="utf-8")).get("step") == step:
                return path
        except (OSError, ValueError):
            continue
    return None


def _sealed_step(run_dir: Path, copies: Path) -> int | None:
    """The newest committed step whose copies both ranks have sealed, or None."""
    steps = _committed(run_dir)
    if steps and all(_header(copies, rank, steps[-1]) for rank in (0, 1)):
        return steps[-1]
    return None


def _host_copies(run: Running, run_id: str) -> Path:
    """The run's host-copy folder: ``nvtrain-<run id>-node0-<pid>-<random part>`` (a name
    nobody else can take first); a path that does not exist while it is not made yet."""
    prefix = f"nvtrain-{run_id}-node0-{run.pid}"
    found = sorted(Path("/dev/shm").glob(f"{prefix}-*"))
    return found[0] if found else Path("/dev/shm") / prefix


def _workers(run: Running, warm: bool) -> dict[int, psutil.Process]:
    """Rank -> the process that trains it (the newest start each rank printed), checked to be
    what the mode says: the ft_launcher child running nvtrain.entry (cold), or a process that
    the warm-start server forked (warm)."""

    def printed() -> dict[int, int]:
        pids = {int(rank): int(pid) for rank, _restart, pid in STARTS.findall(run.stdout)}
        return pids if sorted(pids) == [0, 1] else {}

    pids = _wait(printed, "start line of each rank", run)
    tree = {p.pid for p in psutil.Process(run.pid).children(recursive=True)}
    workers = {}
    for rank, pid in pids.items():
        proc = psutil.Process(pid)
        assert pid in tree, f"rank {rank}'s pid {pid} is not one of nvtrain run's descendants"
        command = " ".join(proc.cmdline())
        parent = " ".join(proc.parent().cmdline())
        if warm:
            assert "nvtrain.zygote.server" in parent, (rank, command, parent)
        else:
            assert "nvtrain.entry" in command and "nvidia_resiliency_ext" in parent, (rank, command, parent)
        workers[rank] = proc
    return workers


def _stopped(proc: psutil.Process) -> bool:
    """Whether every thread of ``proc`` is stopped (a thread in a system call stops on its way
    out of it: until then it may still write)."""
    try:
        tasks = list(Path(f"/proc/{proc.pid}/task").iterdir())
        states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks]
    except OSError:
        return False
    return bool(states) and all(state in ("T", "t") for state in states)


def _signal_all(workers: dict[int, psutil.Process], signum: int) -> None:
    for proc in workers.values():
        proc.send_signal(signum)


def _wait(condition: Any, what: str, run: Running, timeout: float = DEADLINE) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if run.proc.poll() is not None:
            pytest.fail(f"nvtrain exited ({run.proc.returncode}) while waiting for {what}\n{run.describe()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f}s\n{run.describe()}")
        time.sleep(0.05)


def _stop_at_sealed_step(
    run: Running, run_dir: Path, copies: Path, warm: bool
) -> tuple[int, dict[int, psutil.Process]]:
    """Stop both workers at a moment when the newest committed step has both ranks' copies
    sealed; returns that step and the (stopped) workers."""
    deadline = time.monotonic() + DEADLINE
    while True:
        _wait(lambda: _sealed_step(run_dir, copies), "committed step with both copies sealed", run)
        workers = _workers(run, warm)
        _signal_all(workers, signal.SIGSTOP)
        _wait(lambda w=workers: all(_stopped(p) for p in w.values()), "stopped workers", run)
        step = _sealed_step(run_dir, copies)
        if step is not None and step < STEPS:
            return step, workers
        newest = _committed(run_dir)
        _signal_all(workers, signal.SIGCONT)
        assert time.monotonic() < deadline, f"no sealed step to forge while stopped\n{run.describe()}"
        # On: until a newer step is committed (then sealed, or the next round finds why not).
        _wait(lambda n=newest: _committed(run_dir) != n, "newer committed step", run)


def _losses(stdout: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for step, loss in LOSS.findall(stdout):
        found.setdefault(int(step), []).append(loss)
    return found


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_forged_host_copy_is_refused_after_a_sigkill(
    nvtrain: NvtrainRunner, tmp_path: Path, warm: bool
) -> None:
    run_id = f"forged-{'warm' if warm else 'cold'}"
    run_dir = tmp_path / "ckpt" / run_id
    marker = tmp_path / "forged-pickle-ran"
    forged = pickled({"skeleton": Marker(marker), "extra": Marker(marker)})  # made before the run
    run = nvtrain.start("--run-id", run_id, str(_policy(tmp_path, warm)))
    # the folder's name ends in a random part: found once the launcher has made it
    copies = wait_until(lambda: (c := _host_copies(run, run_id)).is_dir() and c, 120, "the host-copy folder")

    step, workers = _stop_at_sealed_step(run, run_dir, copies, warm)
    headers = [_header(copies, rank, step) for rank in (0, 1)]
    for header in headers:
        assert header is not None
        forge_copy(header, forged)
    killed_at = time.time()
    workers[0].send_signal(signal.SIGKILL)
    workers[1].send_signal(signal.SIGCONT)

    code = run.wait(timeout=DEADLINE)
    assert not marker.exists(), f"the forged copy's pickle ran\n{run.describe()}"
    assert code == 0, run.describe()
    out = run.stdout
    assert sorted(int(r) for r, _ in FINGERPRINT.findall(out)) == [0, 1], run.describe()
    events = read_events(run_dir)
    summary = [(e["event"], e.get("rank"), e.get("step"), e.get("origin")) for e in events]
    failed = [e for e in events if e["event"] == "worker_failed" and e["ts"] > killed_at]
    assert any(e.get("signal") == "SIGKILL" and e.get("local_rank") == 0 for e in failed), summary
    restored = [e for e in events if e["event"] == "checkpoint_restored" and e["ts"] > killed_at]
    assert sorted((e["rank"], e["step"], e["origin"]) for e in restored[:2]) == [
        (0, step, "storage"),
        (1, step, "storage"),
    ], summary
    for event in restored[:2]:
        problem = event.get("memory_problem") or ""
        assert "its header's MAC does not verify (not this run's copy)" in problem, event
    starts = [e for e in events if e["event"] == "worker_start" and e["ts"] > killed_at]
    assert len(starts) >= 2 and all(bool(e.get("warm")) is warm for e in starts), starts
    # The replacements replay the steps after N from storage's state: each gives the loss the
    # first attempt printed for it.
    replayed = {s: losses for s, losses in _losses(out).items() if len(losses) > 1}
    assert all(s > step for s in replayed), (step, sorted(replayed))
    assert all(len(set(losses)) == 1 for losses in replayed.values()), replayed
    assert sorted(_losses(out)) == list(range(1, STEPS + 1)), run.describe()

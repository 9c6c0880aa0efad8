"""The soak benchmark (issue 15, item 6): the demo job with 4 ranks on one node (gloo, CPU) for at
least --duration seconds of wall time, with randomly placed faults of every kind the policy can
inject and SIGKILLs of random workers from outside at random times.

At the end it checks and records:

  exit         `nvtrain run` exited 0
  state        every rank's final fingerprint equals a fault-free run's (same steps, no delay)
  faults       every planned fault fired exactly once
  restores     no checkpoint was restored that was not committed before (or was last found
               partial, corrupt or rejected), and the ranks of each restore agreed on the step
  processes    nothing of the run is alive after `nvtrain run` exited (its session, anything
               carrying the run's token or its run id, children re-parented to this driver)
  files        the run's private TMPDIR is empty (tmp state folders, sockets), no new /dev/shm or
               /tmp entry carries the run id or the pid of a process of the run
  duration     the soak run lasted at least --duration seconds

and the figures of `nvtrain report --json`. Exit 1 if a check fails.

    .venv/bin/python benchmarks/soak/soak.py --duration 3600 --out /tmp/soak --json FILE --seed 15
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib.runs import report_json, run_events  # noqa: E402

if TYPE_CHECKING:
    from nvtrain.events.records import Event

ROOT = Path(__file__).resolve().parents[2]
SRC = [ROOT / "src"]  # the nvtrain sources the runs use (--snapshot: an extracted commit)

KINDS = ["exception", "hang", "collective_hang", "sigkill", "collective_sigkill", "oom", "sigterm"]
KILLS = {"sigkill", "collective_sigkill", "oom"}  # placed on a checkpoint step half the time
TOKEN_VAR = "NVT_SOAK_TOKEN"
LAUNCHER_MODULE = "nvidia_resiliency_ext.fault_tolerance.launcher"
FINGERPRINT = re.compile(r"DEMO rank (\d+) finished fingerprint ([0-9a-f]{16})")
CLEARED_NAMES = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "JOB_COMPLETION_INDEX",
    "POD_IP",
}
CLEARED_PREFIXES = ("TORCHELASTIC_", "NVTRAIN_", "PET_", "FT_")


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- the policy ---------------------------------------------------------------------------------


def port_pair() -> int:
    """P with P and P + 1 free (the in-process layer's store sits on P + 1)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports")


def plan_faults(
    rng: random.Random, steps: int, interval: int, count: int, ranks: int
) -> list[dict[str, Any]]:
    """``count`` faults, every kind as often as the others (then shuffled), at random steps at
    least 2 checkpoint intervals apart; half of the killing kinds on a checkpoint step (the
    rank dies while that save is written)."""
    kinds = [KINDS[i % len(KINDS)] for i in range(count)]
    rng.shuffle(kinds)
    first, last = 2 * interval, steps - 2 * interval
    slots = (last - first) // (2 * interval)
    assert slots >= count, f"{steps} steps hold at most {slots} faults {2 * interval} steps apart"
    chosen = sorted(rng.sample(range(slots), count))
    faults = []
    for slot, kind in zip(chosen, kinds, strict=True):
        base = first + slot * 2 * interval
        if kind in KILLS and rng.random() < 0.5:
            step = base + interval  # a checkpoint step
        else:
            step = base + rng.randrange(1, 2 * interval)
        faults.append({"step": step, "rank": rng.randrange(ranks), "kind": kind})
    return faults


def policy_text(
    name: str,
    ckpt: Path,
    steps: int,
    step_time: float,
    args: argparse.Namespace,
    faults: list[dict[str, Any]],
) -> str:
    lines = [
        "[job]",
        f'name = "{name}"',
        'module = "nvtrain.demo"',
        f'args = ["--steps", "{steps}", "--step-time", "{step_time}", "--log-every", "50"]',
        f"nproc_per_node = {args.nproc}",
        f"max_steps = {steps}",
        'backend = "gloo"',
        f'collective_timeout = "{args.collective_timeout}"',
        'stop_timeout = "10s"',
        "",
        "[rendezvous]",
        "nodes = 1",
        f"port = {port_pair()}",
        'join_timeout = "120s"',
        "",
        "[heartbeat]",
        'initial_timeout = "120s"',
        f'timeout = "{args.heartbeat_timeout}"',
        'monitor_interval = "1s"',
        "",
        "[restart]",
        "escalate_after = 1000",  # a run of faults on one rank must not stop the soak
        "",
        "[restart.in_process]",
        "enabled = true",
        "max_attempts = 10000",
        f'soft_timeout = "{args.soft_timeout}"',
        f'hard_timeout = "{args.hard_timeout}"',
        "",
        "[restart.in_job]",
        "max_restarts = 10000",
        "",
        "[checkpoint]",
        f'dir = "{ckpt}"',
        f"interval = {args.interval}",
        "keep = 2",
        "async = true",
        "",
    ]
    for fault in faults:
        lines += [
            "[[faults]]",
            f"step = {fault['step']}",
            f"rank = {fault['rank']}",
            f'kind = "{fault["kind"]}"',
            "",
        ]
    return "\n".join(lines)


# -- running ------------------------------------------------------------------------------------


def child_env(token: str, tmpdir: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in CLEARED_NAMES and not k.startswith(CLEARED_PREFIXES)
    }
    env.update(
        {"PYTHONUNBUFFERED": "1", TOKEN_VAR: token, "TMPDIR": str(tmpdir), "PYTHONPATH": python_path()}
    )
    return env


def python_path() -> str:
    """nvtrain's sources first, then the caller's PYTHONPATH (where NVRx is installed apart, as
    on the GPU machine: benchmarks/recovery/nvrx_site.sh)."""
    return os.pathsep.join(p for p in (str(SRC[0]), os.environ.get("PYTHONPATH", "")) if p)


def tool_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": python_path()}


def snapshot(rev: str, dest: Path) -> str:
    """Extract ``src/`` of commit ``rev`` into ``dest`` (read-only on the repository: others
    edit the working tree while the soak runs, and a restarted worker would import their
    half-done changes). Returns the commit's hash."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", commit, "src"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    assert archive.wait() == 0
    return commit


def carries(proc: psutil.Process, token: str, run_id: str) -> bool:
    with contextlib.suppress(psutil.Error):
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if run_id in " ".join(proc.cmdline()):
            return True
        return proc.environ().get(TOKEN_VAR) == token
    return False


def of_the_run(token: str, run_id: str, sid: int) -> list[psutil.Process]:
    """Every living process of the run: in its session, carrying its token or its run id."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            in_session = os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE
            if in_session or carries(proc, token, run_id):
                found.append(proc)
    return found


def describe(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"{proc.pid} {' '.join(proc.cmdline())[:160]}"
    return str(proc.pid)


def read_events(run_dir: Path) -> list[Event]:
    """Every pod's events in the run directory ``run_dir`` (``events-node<N>.jsonl``; an older
    run's ``events.jsonl``), merged in time order; [] when there is none."""
    # nvtrain is imported once main has put SRC first on the path (so is every reader here)
    return run_events(run_dir)


class Killer(threading.Thread):
    """SIGKILLs a random living worker of the run at random times (exponential gaps), from
    outside; also notes every pid of the run it sees (for the leftover-file check)."""

    def __init__(self, run_dir: Path, out_path: Path, token: str, mean_gap: float, seed: int) -> None:
        from nvtrain.runlog import RunTail

        super().__init__(daemon=True)
        self.out_path, self.token = out_path, token
        self._tail = RunTail(run_dir)  # every pod's events log in the run directory
        self.mean_gap, self.rng = mean_gap, random.Random(seed)
        self.stop = threading.Event()
        self.kills: list[dict[str, Any]] = []
        self.seen_pids: set[int] = set()
        self._ranks: dict[int, int | None] = {}  # worker pid -> rank (worker_start events)

    def _scan_events(self) -> None:
        from nvtrain.events.records import WorkerStart

        with contextlib.suppress(OSError):
            for event in self._tail.poll():
                if isinstance(event, WorkerStart) and event.pid is not None:
                    self._ranks[event.pid] = event.rank
                    self.seen_pids.add(event.pid)

    def _finished(self) -> bool:
        with contextlib.suppress(OSError):
            return b"finished fingerprint" in self.out_path.read_bytes()[-20000:]
        return False

    def _workers(self) -> list[psutil.Process]:
        """The run's workers alive now: ft_launcher's children running the demo (also while
        they start, before their worker_start event; not the monitor processes NVRx forks off
        them, which ft_launcher is not the parent of)."""
        found = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                argv = proc.cmdline()
                # ft_launcher's own argv names the module too, and so do the rank monitors it
                # forks: a worker runs the module, not the launcher
                if "nvtrain.demo" not in argv or LAUNCHER_MODULE in argv:
                    continue
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                parent = proc.parent()
                if parent is None or LAUNCHER_MODULE not in parent.cmdline():
                    continue
                if proc.environ().get(TOKEN_VAR) == self.token:
                    found.append(proc)
        return found

    def _note_pids(self) -> None:
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.environ().get(TOKEN_VAR) == self.token:
                    self.seen_pids.add(proc.pid)

    def run(self) -> None:
        next_kill = time.monotonic() + self.rng.expovariate(1 / self.mean_gap)
        last_note = 0.0
        while not self.stop.wait(0.5):
            try:
                self._scan_events()
                if time.monotonic() - last_note > 5:
                    self._note_pids()
                    last_note = time.monotonic()
                if time.monotonic() < next_kill:
                    continue
                next_kill = time.monotonic() + self.rng.expovariate(1 / self.mean_gap)
                if self._finished():  # the last step is done: the workers are exiting
                    continue
                self._kill_one()
            except Exception as exc:  # a soak must not lose its killer to one odd process
                log(f"killer: {exc!r}")

    def _kill_one(self) -> None:
        workers = self._workers()
        if not workers:
            self.kills.append({"ts": time.time(), "pid": None, "rank": None, "note": "no worker alive"})
            log("external SIGKILL: no worker alive")
            return
        victim = self.rng.choice(workers)
        with contextlib.suppress(psutil.Error):
            victim.send_signal(signal.SIGKILL)
            rank = self._ranks.get(victim.pid)
            self.kills.append({"ts": time.time(), "pid": victim.pid, "rank": rank})
            log(f"external SIGKILL of rank {rank} (pid {victim.pid})")


def run_job(
    policy: Path, run_id: str, out: Path, timeout: float, kill_gap: float | None, seed: int, ckpt: Path
) -> dict[str, Any]:
    token = uuid.uuid4().hex
    tmpdir = out / f"tmp-{run_id}"
    tmpdir.mkdir(parents=True)
    shm_before = set(os.listdir("/dev/shm"))
    tmp_before = set(os.listdir("/tmp"))
    out_path = out / f"{run_id}.out"
    started = time.time()
    with out_path.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nvtrain", "run", str(policy), "--run-id", run_id],
            cwd=out,
            env=child_env(token, tmpdir),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    sid = proc.pid
    killer = None
    if kill_gap:
        killer = Killer(ckpt / run_id, out_path, token, kill_gap, seed)
        killer.start()
    try:
        code: int | None = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log(f"{run_id}: ran past {timeout:.0f}s, stopping it")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        code = None
    wall = time.time() - started
    if killer is not None:
        killer.stop.set()
        killer.join()
    # Leftovers: looked at right after the exit, and again 5 s later (a monitor or writer still
    # winding down at the exit is not a leftover; one still there after 5 s is).
    at_exit = [describe(p) for p in of_the_run(token, run_id, sid)]
    time.sleep(5)
    left = of_the_run(token, run_id, sid)
    leftovers = [describe(p) for p in left]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=5)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    pids = set(killer.seen_pids) if killer else set()
    pids |= {e.pid for e in read_events(ckpt / run_id) if e.pid is not None}
    pids.discard(os.getpid())
    files, empty_dirs = leftover_files(tmpdir, shm_before, tmp_before, run_id, pids)
    output = out_path.read_text(encoding="utf-8", errors="replace")
    prints: dict[int, set[str]] = {}
    for rank, digest in FINGERPRINT.findall(output):
        prints.setdefault(int(rank), set()).add(digest)
    return {
        "run_id": run_id,
        "exit_code": code,
        "wall_s": round(wall, 1),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "fingerprints": {str(r): sorted(d) for r, d in sorted(prints.items())},
        "processes_at_exit": at_exit,
        "leftover_processes": leftovers,
        "leftover_files": files,
        "leftover_empty_dirs": empty_dirs,
        "external_kills": killer.kills if killer else [],
        "output": str(out_path),
    }


def leftover_files(
    tmpdir: Path, shm_before: set[str], tmp_before: set[str], run_id: str, pids: set[int]
) -> tuple[list[str], list[str]]:
    """(files, empty folders) the run left. Files: anything but a folder in its private TMPDIR
    (state files, sockets), an nvtrain state folder there (``nvtrain-<run id>-...``) even if
    empty, and new /dev/shm or /tmp entries named after the run id or a pid of the run. Empty
    folders: other folder trees in TMPDIR that hold no file (torch elastic's per-launch log
    folder ``torchelastic_*``); torch's compile cache ``torchinductor_<user>`` (shared by every
    torch process of the user, not the run's) is not counted."""
    files, empty = [], []
    for top in sorted(tmpdir.iterdir()):
        if top.name.startswith("torchinductor_"):
            continue
        inside = [p for p in top.rglob("*") if not p.is_dir() or p.is_symlink()] if top.is_dir() else [top]
        if inside or top.name.startswith("nvtrain") or not top.is_dir():
            files += [str(top)] + [str(p) for p in sorted(inside) if p != top]
        else:
            empty.append(str(top))

    def ours(name: str) -> bool:
        return run_id in name or any(re.search(rf"(?<!\d){p}(?!\d)", name) for p in pids)

    with contextlib.suppress(OSError):
        files += [f"/dev/shm/{n}" for n in sorted(set(os.listdir("/dev/shm")) - shm_before) if ours(n)]
    with contextlib.suppress(OSError):
        files += [f"/tmp/{n}" for n in sorted(set(os.listdir("/tmp")) - tmp_before) if ours(n)]
    return files, empty


def reuse_reference(folder: Path, policy: str) -> dict[str, Any]:
    """The fault-free run of an earlier soak's --out ``folder`` (same job arguments: checked
    on the [job] args line of its clean.toml), instead of running it again."""
    from nvtrain.events.records import LauncherExit

    theirs = (folder / "clean.toml").read_text()
    args_line = next(line for line in policy.splitlines() if line.startswith("args = "))
    assert args_line in theirs.splitlines(), f"{folder}/clean.toml has other job arguments than {args_line}"
    out_path = next(folder.glob("clean-*.out"))
    run_id = out_path.stem
    output = out_path.read_text(encoding="utf-8", errors="replace")
    prints: dict[int, set[str]] = {}
    for rank, digest in FINGERPRINT.findall(output):
        prints.setdefault(int(rank), set()).add(digest)
    events = read_events(folder / "ckpt" / run_id)
    exits = [e.exit_code for e in events if isinstance(e, LauncherExit)]
    alive = [describe(p) for p in psutil.process_iter() if carries(p, "-", run_id)]
    files, empty = leftover_files(folder / f"tmp-{run_id}", set(), set(), run_id, set())
    wall = events[-1].ts - events[0].ts if events else None
    return {
        "run_id": run_id,
        "reused_from": str(folder),
        "exit_code": exits[-1] if exits else None,
        "wall_s": None if wall is None else round(wall, 1),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(events[0].ts)) if events else None,
        "fingerprints": {str(r): sorted(d) for r, d in sorted(prints.items())},
        "processes_at_exit": [],
        "leftover_processes": alive,
        "leftover_files": files,
        "leftover_empty_dirs": empty,
        "external_kills": [],
        "output": str(out_path),
    }


# -- checks -------------------------------------------------------------------------------------


def check_restores(events: list[Event], ranks: int) -> dict[str, Any]:
    """Walk the log in time order: a step's latest status (committed, partial, corrupt,
    rejected) at the time of each restore must be 'committed'."""
    from nvtrain.events.records import (
        CheckpointAlreadyCommitted,
        CheckpointCommitted,
        CheckpointCorrupt,
        CheckpointPartial,
        CheckpointRejected,
        CheckpointRestored,
    )

    status: dict[int, str] = {}
    problems: list[str] = []
    restores: list[CheckpointRestored] = []
    for e in sorted(events, key=lambda e: e.ts):
        if isinstance(e, CheckpointCommitted | CheckpointAlreadyCommitted) and e.step is not None:
            status[e.step] = "committed"
        elif isinstance(e, CheckpointPartial | CheckpointCorrupt | CheckpointRejected) and e.step is not None:
            if status.get(e.step) == "committed" and not isinstance(e, CheckpointPartial):
                status[e.step] = e.name  # a committed folder found bad afterwards
            elif status.get(e.step) != "committed":
                status[e.step] = e.name
        elif isinstance(e, CheckpointRestored) and e.step:
            restores.append(e)
            if status.get(e.step) != "committed":
                problems.append(
                    f"rank {e.rank} restored step {e.step} from {e.origin} at {e.ts:.3f}, "
                    f"its status then: {status.get(e.step, 'never committed')}"
                )
    # The ranks of one recovery restore the same step: restores closer than 5 s form a group.
    groups: list[list[CheckpointRestored]] = []
    for r in sorted(restores, key=lambda r: r.ts):
        if groups and r.ts - groups[-1][-1].ts < 5.0:
            groups[-1].append(r)
        else:
            groups.append([r])
    disagreements = [[(r.rank, r.step, r.origin) for r in g] for g in groups if len({r.step for r in g}) > 1]
    incomplete = [[(r.rank, r.step) for r in g] for g in groups if len({r.rank for r in g}) < ranks]
    origins: dict[str, int] = {}
    for r in restores:
        origins[str(r.origin)] = origins.get(str(r.origin), 0) + 1
    return {
        "restores": len(restores),
        "by_origin": origins,
        "committed_steps": len([s for s, v in status.items() if v == "committed"]),
        "partial_found": sum(isinstance(e, CheckpointPartial) for e in events),
        "corrupt_found": sum(isinstance(e, CheckpointCorrupt) for e in events),
        "rejected": sum(isinstance(e, CheckpointRejected) for e in events),
        "recoveries_with_restore": len(groups),
        "problems": problems,
        "step_disagreements": disagreements,
        "groups_without_every_rank": incomplete,
    }


def check_faults(events: list[Event], planned: list[dict[str, Any]]) -> dict[str, Any]:
    from nvtrain.events.records import FaultInjected

    fired = sorted((e.step, e.rank, e.kind) for e in events if isinstance(e, FaultInjected))
    wanted = sorted((f["step"], f["rank"], f["kind"]) for f in planned)
    return {
        "planned": len(wanted),
        "fired": len(fired),
        "missing": [list(t) for t in wanted if t not in fired],
        "extra_or_repeated": [list(t) for t in fired if fired.count(t) > 1 or t not in wanted],
    }


def report(run_dir: Path) -> dict[str, Any]:
    return report_json(run_dir, extra=["--no-timeline"], env=tool_env(), keep=2000)


def dist(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "median": round(statistics.median(ordered), 3),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
        "max": round(ordered[-1], 3),
    }


def summarize_report(rep: dict[str, Any]) -> dict[str, Any]:
    """The figures of ``nvtrain report --json`` worth a table (no per-event series)."""
    if "error" in rep:
        return rep
    incidents = rep.get("incidents", [])
    by_layer: dict[str, list[float]] = {}
    by_cause: dict[str, list[float]] = {}
    for inc in incidents:
        if inc.get("recovery_s") is not None:
            by_layer.setdefault(str(inc.get("layer")), []).append(inc["recovery_s"])
            by_cause.setdefault(str(inc.get("cause")), []).append(inc["recovery_s"])
    checkpoints = {k: v for k, v in (rep.get("checkpoints") or {}).items() if k not in ("commits",)}
    return {
        "exit_code": rep.get("exit_code"),
        "incidents": len(incidents),
        "unrecovered_incidents": [i.get("index") for i in incidents if not i.get("recovered")],
        "recovery_s_by_layer": {k: dist(v) for k, v in sorted(by_layer.items())},
        "recovery_s_by_cause": {k: dist(v) for k, v in sorted(by_cause.items())},
        "recovery": rep.get("recovery"),
        "restarts": rep.get("restarts"),
        "goodput": rep.get("goodput"),
        "time_s": rep.get("time_s"),
        "steps": rep.get("steps"),
        "rollback": rep.get("rollback"),
        "freshness_at_faults": (rep.get("freshness") or {}).get("at_faults"),
        "checkpoints": checkpoints,
        "notes": rep.get("notes"),
    }


# -- main ---------------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=3600.0, help="least wall time of the soak run, s")
    p.add_argument("--out", type=Path, required=True, help="work folder (checkpoints, outputs)")
    p.add_argument(
        "--json", type=Path, default=None, help="results file (default: results/soak-<stamp>.json)"
    )
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--step-time", type=float, default=0.5, help="the demo's sleep per step, s")
    p.add_argument(
        "--step-cost",
        type=float,
        default=0.07,
        help="expected compute + collectives per step beyond the sleep, s",
    )
    p.add_argument(
        "--steps", type=int, default=None, help="default: enough for --duration without faults at --step-time"
    )
    p.add_argument("--interval", type=int, default=20, help="checkpoint interval, steps")
    p.add_argument(
        "--fault-every", type=float, default=90.0, help="one planned fault per this many s of steps"
    )
    p.add_argument("--kill-every", type=float, default=180.0, help="mean gap of the external SIGKILLs, s")
    p.add_argument("--collective-timeout", default="4s")
    p.add_argument("--soft-timeout", default="6s")
    p.add_argument("--hard-timeout", default="12s")
    p.add_argument("--heartbeat-timeout", default="15s")
    p.add_argument("--timeout", type=float, default=None, help="kill the soak run after this, s")
    p.add_argument(
        "--snapshot", default="HEAD", help="run nvtrain from this commit's src/ ('none': the working tree)"
    )
    p.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="reuse the fault-free run of an earlier soak's --out folder (same steps) instead of running it",
    )
    args = p.parse_args()
    # orphans of the runs come to this driver: none escapes the checks
    rng = random.Random(args.seed)
    out = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    commit = "working tree"
    if args.snapshot != "none":
        commit = snapshot(args.snapshot, out / "snapshot")
        SRC[0] = out / "snapshot" / "src"
    sys.path.insert(0, str(SRC[0]))
    from nvtrain.launcher.process import become_subreaper

    become_subreaper()  # orphans of the runs come to this driver: none escapes the checks
    log(f"nvtrain from {SRC[0]} ({commit})")
    ckpt = out / "ckpt"
    per_step = args.step_time + args.step_cost
    steps = args.steps or int(args.duration / per_step) + 1
    n_faults = max(len(KINDS), round(steps * per_step / args.fault_every))
    faults = plan_faults(rng, steps, args.interval, n_faults, args.nproc)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    soak_id, clean_id = f"soak-{stamp.lower()}", f"clean-{stamp.lower()}"
    soak_policy = out / "soak.toml"
    clean_policy = out / "clean.toml"
    soak_policy.write_text(policy_text("soak", ckpt, steps, args.step_time, args, faults))
    clean_policy.write_text(policy_text("soak-clean", ckpt, steps, 0.0, args, []))
    log(
        f"{steps} steps x {per_step:.2f} s, {len(faults)} planned faults, "
        f"external kills every ~{args.kill_every:.0f} s"
    )
    check = subprocess.run(
        [sys.executable, "-m", "nvtrain", "validate", str(soak_policy)],
        capture_output=True,
        text=True,
        check=False,
        env=tool_env(),
    )
    if check.returncode != 0:
        print(check.stdout, check.stderr)
        return 2

    if args.reference is not None:
        clean = reuse_reference(args.reference.resolve(), clean_policy.read_text())
        log(f"reference reused from {args.reference}: exit {clean['exit_code']}, {clean['fingerprints']}")
    else:
        log("fault-free reference run (no per-step sleep)")
        clean = run_job(clean_policy, clean_id, out, max(600.0, steps * 0.5), None, 0, ckpt)
        log(f"reference: exit {clean['exit_code']} in {clean['wall_s']} s")

    log(f"soak run {soak_id}")
    timeout = args.timeout or args.duration * 1.5 + 600
    soak = run_job(soak_policy, soak_id, out, timeout, args.kill_every, args.seed + 1, ckpt)
    log(f"soak: exit {soak['exit_code']} in {soak['wall_s']} s, {len(soak['external_kills'])} external kills")

    events = read_events(ckpt / soak_id)
    restores = check_restores(events, args.nproc)
    fired = check_faults(events, faults)
    rep = report(ckpt / soak_id)
    clean_prints = clean["fingerprints"]
    soak_prints = soak["fingerprints"]
    kill_kinds: dict[str, int] = {}
    for f in faults:
        kill_kinds[f["kind"]] = kill_kinds.get(f["kind"], 0) + 1
    hit = [k for k in soak["external_kills"] if k.get("pid")]
    run_dir = ckpt / soak_id
    on_disk = (
        sorted(p.name for p in run_dir.iterdir() if p.name.startswith("step-")) if run_dir.is_dir() else []
    )
    checks = {
        "exit_0": soak["exit_code"] == 0 and clean["exit_code"] == 0,
        "state_equals_fault_free": (
            len(clean_prints) == args.nproc
            and all(len(v) == 1 for v in clean_prints.values())
            and soak_prints == clean_prints
        ),
        "every_fault_fired_once": not fired["missing"] and not fired["extra_or_repeated"],
        "no_partial_restore": not restores["problems"] and not restores["step_disagreements"],
        "no_process_left": not soak["leftover_processes"] and not clean["leftover_processes"],
        "no_file_left": not soak["leftover_files"] and not clean["leftover_files"],
        "lasted_duration": soak["wall_s"] >= args.duration,
        "report_ok": "error" not in rep and not summarize_report(rep).get("unrecovered_incidents"),
    }
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "nvtrain_commit": commit,
        "host": {"cpus": os.cpu_count(), "load_at_end": os.getloadavg()},
        "params": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "steps": steps,
        },
        "planned_faults": faults,
        "faults_by_kind": dict(sorted(kill_kinds.items())),
        "external_sigkills": {
            "count": len(hit),
            "attempts": len(soak["external_kills"]),
            "log": soak["external_kills"],
        },
        "checks": checks,
        "passed": all(checks.values()),
        "warnings": [
            f"empty folder tree left in the run's TMPDIR: {d}"
            for d in clean["leftover_empty_dirs"] + soak["leftover_empty_dirs"]
        ],
        "fault_check": fired,
        "restore_check": restores,
        "checkpoint_folders_at_end": on_disk,
        "clean_run": clean,
        "soak_run": soak,
        "report_summary": summarize_report(rep),
        "report": rep,
    }
    dest = args.json or ROOT / "benchmarks" / "soak" / "results" / f"soak-{stamp}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(result, indent=1, default=str) + "\n")
    results_copy = ROOT / "benchmarks" / "soak" / "results" / dest.name
    if dest.resolve() != results_copy.resolve():
        results_copy.parent.mkdir(parents=True, exist_ok=True)
        results_copy.write_text(dest.read_text())
    for name, ok in checks.items():
        log(f"check {name}: {'PASS' if ok else 'FAIL'}")
    log(f"results: {dest}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

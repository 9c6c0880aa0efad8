"""Helpers of the worker-library tests: policies, ``nvtrain run`` children, output parsing.

Every child a test starts carries a unique token in its environment (``NVT_WORKER_TEST_TOKEN``),
which ft_launcher, the rank monitors and the workers inherit; ``kill_token`` ends every process
still carrying it, whoever its parent is by then, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from nvtrain.events import read_events as events_in
from nvtrain.findings import toml_value
from nvtrain.runlog import pod_files
from support.ports import free_port_pair

BIN = Path(__file__).resolve().parent / "bin"
TOKEN_VAR = "NVT_WORKER_TEST_TOKEN"

# Set by torchrun, ft_launcher, Kubernetes or a shell; none may leak into a child.
_CLEARED_NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "JOB_COMPLETION_INDEX",
    "POD_IP",
    "NVIDIA_VISIBLE_DEVICES",
)
_CLEARED_PREFIXES = ("TORCHELASTIC_", "NVTRAIN_", "PET_", "FT_")

LOSS_LINE = re.compile(r"DEMO step (\d+)/(\d+) loss (-?\d+\.\d{5})")
FINGERPRINT_LINE = re.compile(r"DEMO rank (\d+) finished fingerprint ([0-9a-f]{16})")


def child_env(token: str | None = None, **extra: str) -> dict[str, str]:
    """The test process's environment without rank, launcher or nvtrain variables."""
    env = {
        k: v for k, v in os.environ.items() if k not in _CLEARED_NAMES and not k.startswith(_CLEARED_PREFIXES)
    }
    env["PYTHONUNBUFFERED"] = "1"
    if token is not None:
        env[TOKEN_VAR] = token
    env.update(extra)
    return env


def run_key_env(folder: Path) -> dict[str, str]:
    """What ``nvtrain run`` gives a node's workers for their host copies' key: a new private
    folder (0700) ``folder`` holding a new random run key (0600); the variable naming it."""
    from nvtrain.private import RUN_KEY_ENV, make_private_dir, write_run_key

    make_private_dir(folder, exist_ok=False)
    write_run_key(folder / "run.key")
    return {RUN_KEY_ENV: str(folder / "run.key")}


def _toml(value: Any) -> str:
    return toml_value(value, limit=1 << 20)  # the project's own TOML writer, never shortened


def write_policy(
    path: Path, tables: dict[str, dict[str, Any]], faults: Sequence[dict[str, Any]] = ()
) -> Path:
    """Write ``tables`` (``{"job": {...}, "restart.in_job": {...}}``) and ``[[faults]]`` as TOML."""
    lines = []
    for table, keys in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {_toml(value)}" for key, value in keys.items()]
        lines.append("")
    for fault in faults:
        lines.append("[[faults]]")
        lines += [f"{key} = {_toml(value)}" for key, value in fault.items()]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def processes_with_token(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid == os.getpid():
                continue
            if proc.environ().get(TOKEN_VAR) == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def kill_token(token: str) -> list[int]:
    """SIGKILL every living process that carries ``token``; returns their pids."""
    procs = processes_with_token(token)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=5.0)
    return [p.pid for p in procs]


class RunResult:
    """What one ``nvtrain run`` left: exit code, output, events."""

    def __init__(
        self, code: int, output: str, run_dir: Path, seconds: float, leftovers: Sequence[str] = ()
    ) -> None:
        self.code = code
        self.output = output
        self.run_dir = run_dir
        self.seconds = seconds
        self.leftovers = list(leftovers)
        """Processes of the run still alive when ``nvtrain run`` had exited (then killed), and
        the host-copy folder if ``nvtrain run`` left it in /dev/shm (then removed)."""

    @property
    def events(self) -> list[dict[str, Any]]:
        return read_events(self.run_dir)

    def fingerprints(self) -> dict[int, str]:
        """Rank -> fingerprint; a rank printing two different ones is a failure."""
        found: dict[int, str] = {}
        for rank, digest in FINGERPRINT_LINE.findall(self.output):
            assert found.setdefault(int(rank), digest) == digest, f"rank {rank} printed two fingerprints"
        return found

    def losses(self) -> dict[int, list[str]]:
        """Step -> every loss printed for it (a replayed step appears more than once)."""
        found: dict[int, list[str]] = {}
        for step, _total, loss in LOSS_LINE.findall(self.output):
            found.setdefault(int(step), []).append(loss)
        return found

    def describe(self, tail: int = 8000) -> str:
        return f"exit {self.code} after {self.seconds:.0f}s; output tail:\n{self.output[-tail:]}"


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of the run directory ``path`` (every pod's log, merged in time order) or of
    the log file ``path`` (a torn last line is skipped); [] when there is none yet."""
    files = pod_files(path) if path.is_dir() else [path] if path.is_file() else []
    events = [e.as_dict() for file in files for e in events_in(file)]
    return sorted(events, key=lambda e: float(e["ts"]))


def start_nvtrain(
    policy: Path, run_id: str, cwd: Path, out_path: Path, token: str, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``python -m nvtrain run POLICY --run-id ID`` in a session of its own, its output
    in ``out_path`` and ``token`` in its environment (``kill_token`` finds what it leaves),
    with ``extra_env`` added to it."""
    argv = [sys.executable, "-m", "nvtrain", "run", str(policy), "--run-id", run_id]
    with out_path.open("wb") as out:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=child_env(token, **(extra_env or {})),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run_nvtrain(
    policy: Path,
    run_id: str,
    checkpoint_dir: Path,
    cwd: Path,
    timeout: float,
    extra_env: dict[str, str] | None = None,
) -> RunResult:
    """``python -m nvtrain run POLICY --run-id ID`` to its end, or ``timeout`` seconds; whatever
    is left is killed, pass or fail."""
    token = uuid.uuid4().hex
    out_path = cwd / f"{run_id}.out"
    started = time.monotonic()
    proc = start_nvtrain(policy, run_id, cwd, out_path, token, extra_env)
    try:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = -999
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        leftovers = [_describe(p) for p in processes_with_token(token)]
        kill_token(token)
        # nvtrain keeps the resolved policy in <tmp>/nvtrain-<run id>-node0-<its pid>; only this
        # launcher's is removed (another run of the same id may be using its own).
        shutil.rmtree(Path(tempfile.gettempdir()) / f"nvtrain-{run_id}-node0-{proc.pid}", ignore_errors=True)
        # ... and the ranks' host copies in /dev/shm (the default [checkpoint] memory_dir).
        host_copies = Path("/dev/shm") / f"nvtrain-{run_id}-node0-{proc.pid}"
        if host_copies.exists():
            leftovers.append(f"host copies {host_copies}: {sorted(p.name for p in host_copies.iterdir())}")
            shutil.rmtree(host_copies, ignore_errors=True)
    output = out_path.read_text(encoding="utf-8", errors="replace")
    return RunResult(code, output, checkpoint_dir / run_id, time.monotonic() - started, leftovers)


class WarmServer:
    """nvtrain's warm-start server (``nvtrain.zygote.server``) for the ranks the tests start
    themselves (``run_ranks``): each rank is a process forked from an interpreter that has torch,
    NVRx and the worker library imported, as under ``[job] warm_start = true``, instead of a
    cold ``python`` that imports them again (about 6 s of CPU each)."""

    def __init__(self, folder: Path) -> None:
        self.socket = folder / "zygote.sock"
        self.log = folder / "zygote.log"
        self._start()

    def _start(self) -> None:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nvtrain.zygote.server", "--socket", str(self.socket)]
                + ["--module", "nvtrain.demo"],
                env=child_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while not self.socket.exists():  # bound before its imports: clients queue until then
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, f"no socket after 60 s: {self.log.read_text()}"
            time.sleep(0.02)

    def client(self, argv: Sequence[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """``python SCRIPT ARGS`` (argv) as a client of this server, and its environment."""
        assert argv[0] == sys.executable and not argv[1].startswith("-"), argv
        if self.proc.poll() is not None:
            # Ended by an earlier test of this test process: ``Child.stop`` ends with
            # ``kill_all``, which signals every descendant of the calling process, this server
            # included (tests/launcher/test_child_process.py). Started again, on the same path.
            self.socket.unlink(missing_ok=True)
            self._start()
        return [sys.executable, "-m", "nvtrain.zygote.client", *argv[1:]], {
            **env,
            "NVTRAIN_ZYGOTE": str(self.socket),
        }

    def check(self) -> None:
        """The server is still serving (else its clients started cold)."""
        log = self.log.read_text()
        assert self.proc.poll() is None and "warm start: off" not in log, log

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def run_ranks(
    argvs: Sequence[Sequence[str]],
    envs: Sequence[dict[str, str]],
    timeout: float = 100.0,
    warm: WarmServer | None = None,
) -> list[str]:
    """Run one process per rank (``argvs[r]`` with ``envs[r]``, each in a session of its own) to
    its end and return their outputs; ``warm``: forked by that server (``python SCRIPT ARGS``
    only). Every rank must exit 0 within ``timeout`` seconds; else all are killed and the
    failure shows every rank's exit code and output."""
    if warm is not None:
        pairs = [warm.client(argv, env) for argv, env in zip(argvs, envs, strict=True)]
        argvs, envs = [argv for argv, _ in pairs], [env for _, env in pairs]
    procs = [
        subprocess.Popen(
            list(argv),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for argv, env in zip(argvs, envs, strict=True)
    ]
    outputs: list[str | None] = [None] * len(procs)
    deadline = time.monotonic() + timeout
    try:
        for rank, proc in enumerate(procs):
            outputs[rank] = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))[0]
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for rank, proc in enumerate(procs):
            if outputs[rank] is None:
                outputs[rank] = proc.communicate()[0]  # what it wrote before the kill
    texts = [out or "" for out in outputs]
    codes = [proc.returncode for proc in procs]
    if warm is not None:
        warm.check()
    assert codes == [0] * len(procs), (
        f"exit codes {codes} (-9: still running after {timeout:g} s, killed)\n"
        + ("\n".join(f"--- rank {rank} ---\n{text[-3000:]}" for rank, text in enumerate(texts)))
    )
    return texts


def _describe(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return f"{proc.pid} {' '.join(proc.cmdline())[:200]}"
    return str(proc.pid)


def run_python(
    args: Sequence[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a session of its own, killed (with its group) on timeout."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        env=env if env is not None else child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"python {' '.join(args)} ran past {timeout}s:\n{out[-4000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, None)


def assert_clean_exit(run: RunResult) -> None:
    """Exit 0, and nothing of the run alive once ``nvtrain run`` has exited."""
    assert run.code == 0, run.describe()
    assert run.leftovers == [], f"left running after the run: {run.leftovers}"


def assert_no_stop_timeout_waited(run: RunResult, stop_timeout: float) -> None:
    """No worker ignored ft_launcher's SIGTERM (ft_launcher logs 'Unable to shutdown' when it
    kills one after the stop timeout: how survivors stuck in NVRx's restart path used to end),
    no stopped worker took longer than its settle bound (its own ``worker_stopped.waited_s``),
    and every incident was recovered. These are events, not wall time: the time from the fault
    to the next rendezvous is no measure of it on a loaded machine (8.2 s against a 5 s stop
    timeout in a CI run, where every worker had stopped within its bound)."""
    from nvtrain.report import read_report

    assert "Unable to shutdown process" not in run.output, run.describe()
    stopped = [e for e in run.events if e["event"] == "worker_stopped"]
    slow = [e for e in stopped if e.get("waited_s", 0.0) > 1.0 + stop_timeout / 2]
    assert slow == [], slow
    report = read_report(run.run_dir)
    assert report.incidents, "no incident in the report"
    for incident in report.incidents:
        assert incident.end_t is not None, f"incident {incident.index} was not recovered: {incident}"


def demo_tables(checkpoint_dir: Path, *, name: str, ranks: int, steps: int) -> dict[str, dict[str, Any]]:
    """A demo policy for fault-matrix runs: short timeouts that still hold on a loaded 2-core
    machine (a hang is seen after 5 s; gloo collectives blocked by a dead peer time out at 4 s,
    before the soft timeout as validate requires)."""
    return {
        "job": {
            "name": name,
            "module": "nvtrain.demo",
            "args": ["--steps", str(steps), "--step-time", "0", "--log-every", "1"],
            "nproc_per_node": ranks,
            "max_steps": steps,
            "backend": "gloo",
            "collective_timeout": "4s",
            "stop_timeout": "10s",
            # The fault-free references start cold (opted out); the faulty runs opt in to the
            # warm start (the default) explicitly, so each comparison is warm against cold.
            "warm_start": False,
        },
        "rendezvous": {"nodes": 1, "port": free_port_pair(), "join_timeout": "60s"},
        "heartbeat": {"initial_timeout": "90s", "timeout": "12s", "monitor_interval": "1s"},
        "restart": {"escalate_after": 5},
        "restart.in_process": {
            "enabled": True,
            "max_attempts": 5,
            "soft_timeout": "5s",
            "hard_timeout": "10s",
        },
        "restart.in_job": {"max_restarts": 5},
        "checkpoint": {"dir": str(checkpoint_dir), "interval": 5, "async": True, "keep": 2},
    }


def clean_demo_run(tmp_path_factory: pytest.TempPathFactory, *, ranks: int, steps: int) -> RunResult:
    """The fault-free reference of the demo (``demo_tables``) with ``ranks`` ranks on one node and
    ``steps`` steps, run once per test session and shared by every module that compares a faulty
    run with it, whichever xdist process asks first (the others wait on a file lock).

    The demo's state after step N depends only on N and the world size (each rank's batches come
    from (step, rank)): the same run on 2 pods x 2 ranks ends with the same fingerprints as on
    one node with 4 ranks. It is an ordinary cold ``nvtrain run`` in its own folder, checked by
    the callers like any other run (exit code, leftovers, fingerprints)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, shared by the xdist processes
    root = base / f"clean-demo-{ranks}x{steps}"
    root.mkdir(exist_ok=True)
    summary = root / "result.json"
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not summary.exists():
            checkpoints = root / "ckpt"
            tables = demo_tables(checkpoints, name="clean-demo", ranks=ranks, steps=steps)
            run = run_nvtrain(write_policy(root / "clean.toml", tables), "clean", checkpoints, root, 200)
            result = {
                "code": run.code,
                "output": run.output,
                "run_dir": str(run.run_dir),
                "seconds": run.seconds,
                "leftovers": run.leftovers,
            }
            tmp = summary.with_suffix(".tmp")
            tmp.write_text(json.dumps(result), encoding="utf-8")
            tmp.replace(summary)
    saved = json.loads(summary.read_text(encoding="utf-8"))
    return RunResult(
        saved["code"], saved["output"], Path(saved["run_dir"]), saved["seconds"], saved["leftovers"]
    )

"""Helpers for the process tests: real ``nvtrain run`` children, policies, no leftovers.

Every ``nvtrain run`` a test starts gets a unique token in its environment (``NVT_TEST_TOKEN``),
which ft_launcher, the rank monitors and the workers inherit. The finalizer kills every process
that still carries the token, whoever its parent is by then, so a failing test leaves nothing
behind. While a run is alive, a watcher thread records every descendant it sees (pid, start
time, command line), for the tests that check that none survives.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from nvtrain.events import read_events as events_in
from nvtrain.findings import toml_value
from nvtrain.runlog import pod_files
from support.ports import free_port_pair

BIN = Path(__file__).resolve().parent / "bin"
LAUNCHER_MODULE = "nvidia_resiliency_ext.fault_tolerance.launcher"
TOKEN_VAR = "NVT_TEST_TOKEN"

# Variables of a Kubernetes pod or a developer shell that would change nvtrain's identity.
_POD_VARS = ("JOB_COMPLETION_INDEX", "POD_IP", "NVIDIA_VISIBLE_DEVICES")


def _toml(value: Any) -> str:
    return toml_value(value, limit=1 << 20)  # the project's own TOML writer, never shortened


def write_policy(directory: Path, tables: dict[str, dict[str, Any]], name: str = "policy.toml") -> Path:
    """Write ``tables`` (``{"job": {...}, "restart.in_job": {...}}``) as a TOML file."""
    lines = []
    for table, keys in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {_toml(value)}" for key, value in keys.items()]
        lines.append("")
    path = directory / name
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def make_policy(
    directory: Path,
    *,
    script: str | None = None,
    module: str | None = None,
    args: Sequence[str] = (),
    nproc: int = 2,
    max_restarts: int = 2,
    escalate_after: int = 3,
    stop_timeout: str = "3s",
    port: int | None = None,
    rendezvous: dict[str, Any] | None = None,
    heartbeat: dict[str, Any] | None = None,
    warm_start: bool = False,
) -> tuple[Path, dict[str, dict[str, Any]]]:
    """A policy with short timeouts for process tests; returns (path, tables). ``warm_start``:
    the workers are forked from the run's warm-start server (for runs that restart their workers:
    each restart is then a fork, not a new interpreter importing torch again)."""
    job: dict[str, Any] = {"name": "proc-test"}
    if script is not None:
        job["script"] = script
    if module is not None:
        job["module"] = module
    job.update(
        {
            "args": list(args),
            "nproc_per_node": nproc,
            "stop_timeout": stop_timeout,
            "collective_timeout": "10s",
            "warm_start": warm_start,
        }
    )
    tables: dict[str, dict[str, Any]] = {
        "job": job,
        "rendezvous": {"port": port or free_port_pair(), "join_timeout": "30s", **(rendezvous or {})},
        "heartbeat": {
            "initial_timeout": "20s",
            "timeout": "4s",
            "monitor_interval": "1s",
            **(heartbeat or {}),
        },
        "restart": {"escalate_after": escalate_after},
        "restart.in_process": {"enabled": False},
        "restart.in_job": {"max_restarts": max_restarts},
        "checkpoint": {"dir": str(directory / "ckpt")},
    }
    return write_policy(directory, tables), tables


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of the run directory ``path`` (every pod's log, merged in time order) or of
    the log file ``path``, as the log holds them (``Event.as_dict``; a torn last line is
    skipped); [] when there is none yet."""
    files = pod_files(path) if path.is_dir() else [path] if path.is_file() else []
    events = [event.as_dict() for file in files for event in events_in(file)]
    return sorted(events, key=lambda event: float(event["ts"]))


def processes_with_env(name: str, value: str) -> list[psutil.Process]:
    """Living processes (other than this one) whose environment has ``name=value``, among
    those whose environment we may read."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid == os.getpid():
                continue
            if proc.environ().get(name) == value and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def processes_with_token(token: str) -> list[psutil.Process]:
    """Living processes started by the ``nvtrain run`` that got ``token``."""
    return processes_with_env(TOKEN_VAR, token)


def alive(pid: int, create_time: float) -> bool:
    """Whether the process recorded as (pid, create_time) still runs (zombies count as gone)."""
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == create_time and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Running:
    """One ``nvtrain run`` child with its output files and the descendants seen so far."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, out_dir: Path, token: str) -> None:
        self.argv = argv
        self.token = token
        self.stdout_path = out_dir / "nvtrain.stdout"
        self.stderr_path = out_dir / "nvtrain.stderr"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=out, stderr=err, start_new_session=True
            )
        self.pid = self.proc.pid
        self.seen: dict[tuple[int, float], list[str]] = {}
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.is_set() and self.proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(self.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        key = (child.pid, child.create_time())
                        if key not in self.seen:
                            self.seen[key] = child.cmdline()
            self._stop.wait(0.1)

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(encoding="utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def describe(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\n--- stderr ---\n{self.stderr[-4000:]}\n"
            f"--- stdout (tail) ---\n{self.stdout[-6000:]}"
        )

    def wait(self, timeout: float) -> int:
        """Exit code, or a test failure (with the output) if it runs longer than ``timeout``."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"nvtrain still running after {timeout:.0f}s\n{self.describe()}")
        self._stop.set()
        self._watcher.join(timeout=2)
        return code

    def wait_for_stdout(self, pattern: str, count: int = 1, timeout: float = 60.0) -> list[re.Match[str]]:
        """Wait until ``pattern`` matched ``count`` times in stdout; fail if nvtrain ends first.

        Matches are counted in the whole text, not per line: two workers that share the
        pipe can interleave their writes so that two markers land on one line.
        """
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            matches = list(regex.finditer(self.stdout))
            if len(matches) >= count:
                return matches
            if self.proc.poll() is not None:
                pytest.fail(f"nvtrain exited ({self.proc.returncode}) before {pattern!r}\n{self.describe()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {count} x {pattern!r} within {timeout:.0f}s\n{self.describe()}")
            time.sleep(0.1)

    def launcher_seen(self) -> bool:
        """Whether ft_launcher ever ran: its own log lines in the output (``[ft_launcher<pid>@host]``
        in NVRx 0.4, ``Using nproc_per_node=`` in all; nvtrain shows its warnings and errors on
        stderr), or a process seen among the descendants (the sampler alone can miss a launcher
        that lives a few seconds on a loaded machine)."""
        if re.search(r"\[ft_launcher\d+@|Using nproc_per_node=", self.stdout + self.stderr):
            return True
        return any(LAUNCHER_MODULE in " ".join(cmd) for cmd in self.seen.values())

    def cleanup(self) -> None:
        self._stop.set()
        targets: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.pid).children(recursive=True):
                targets[child.pid] = child
        for pid, create_time in self.seen:
            if alive(pid, create_time):
                with contextlib.suppress(psutil.Error):
                    targets[pid] = psutil.Process(pid)
        for proc in processes_with_token(self.token):
            targets[proc.pid] = proc
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        for proc in targets.values():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        psutil.wait_procs(list(targets.values()), timeout=5)


def with_hosts(directory: Path, names: Sequence[str], address: str = "127.0.0.1") -> list[str]:
    """A command prefix that runs its command with ``names`` in ``/etc/hosts`` (mapped to
    ``address``) and the machine's own entries kept: a private mount namespace with a file
    bind-mounted over ``/etc/hosts``. Nothing else is isolated (same network, same processes),
    and the real resolver answers (glibc reads the file; so do torch's C++ getaddrinfo calls).
    Skips the test where mount namespaces are not available (root, or unprivileged user
    namespaces, and util-linux's ``unshare``/``mount`` are needed).
    """
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        _not_here("needs util-linux (unshare, mount) for a private /etc/hosts")
    hosts = directory / "hosts"
    original = Path("/etc/hosts").read_text(encoding="utf-8") if Path("/etc/hosts").is_file() else ""
    hosts.write_text(original + "".join(f"\n{address} {name}" for name in names) + "\n", encoding="utf-8")
    userns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    prefix = [
        "unshare", *userns, "--mount", "--propagation", "private", "--",
        "sh", "-c", f'mount --bind "{hosts}" /etc/hosts && exec "$@"', "sh",
    ]  # fmt: skip
    probe = subprocess.run(
        [*prefix, "getent", "hosts", names[0]], capture_output=True, text=True, timeout=30, check=False
    )
    if probe.returncode != 0 or address not in probe.stdout:
        _not_here(f"cannot give a process its own /etc/hosts here: {probe.stderr.strip() or probe.stdout}")
    return prefix


# Read at import time, as tests/launcher/multinode/conftest.py does: the root conftest clears every
# NVTRAIN_* variable around each test, so a read inside the test would never see it.
_REQUIRE = os.environ.get("NVTRAIN_MULTINODE", "").strip().lower() == "require"


def _not_here(reason: str) -> None:
    """Skip, or fail where the environment promises mount namespaces: CI sets
    NVTRAIN_MULTINODE=require (as for the multi-node tests), so these tests cannot silently vanish."""
    if _REQUIRE:
        pytest.fail(reason + " (NVTRAIN_MULTINODE=require)", pytrace=False)
    pytest.skip(reason)


class NvtrainRunner:
    """Starts ``python -m nvtrain run ...`` in ``tmp_path`` with a private, short TMPDIR."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        # ft_launcher puts Unix sockets in $TMPDIR (path limit 107 bytes): keep it short.
        self.tmpdir = Path(tempfile.mkdtemp(prefix="nvt-"))
        self.runs: list[Running] = []

    def env(self, token: str, extra: dict[str, str] | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _POD_VARS}
        env.update({"TMPDIR": str(self.tmpdir), TOKEN_VAR: token, "PYTHONUNBUFFERED": "1"})
        env.update(extra or {})
        return env

    def start(self, *args: str, env: dict[str, str] | None = None, prefix: Sequence[str] = ()) -> Running:
        """Start ``nvtrain run ARGS``; ``prefix`` is a command that execs it (``with_hosts``)."""
        token = uuid.uuid4().hex
        out_dir = self.tmp_path / f"run{len(self.runs)}"
        out_dir.mkdir()
        argv = [*prefix, sys.executable, "-m", "nvtrain", "run", *args]
        running = Running(argv, self.env(token, env), self.tmp_path, out_dir, token)
        self.runs.append(running)
        return running

    def close(self) -> None:
        for running in self.runs:
            running.cleanup()
            # A run killed with SIGKILL cannot remove its host-copy folder in /dev/shm (the
            # default [checkpoint] memory_dir, named after the launcher's pid); in a pod it goes
            # with the pod, here the test removes it.
            for pattern in (f"nvtrain-*-node*-{running.proc.pid}", f"nvtrain-*-node*-{running.proc.pid}-*"):
                for folder in Path("/dev/shm").glob(pattern):  # (with or without the random part)
                    shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


Mount = Callable[[str], Path]
"""The ``mount`` fixture (conftest.py): ``mount("2m")`` is a fresh tmpfs of that size."""

"""Reliability review, through the command line: FIFOs and devices as policies, outputs onto
inputs, Ctrl-C at any moment of start-up, and a rendezvous port that another process holds."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import nvtrain.config.validation
from nvtrain.cli import app
from nvtrain.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
CPU_LOG = ROOT / "tests" / "tuning" / "data" / "cpu-demo-events.jsonl"
TIMINGS = ["--step-time", "1s", "--save-block", "1s", "--save-write", "10s", "--mtbf", "8h"]
runner = CliRunner()
MESSAGE = "nvtrain: interrupted (SIGINT)"


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


MEMORY_LIMIT = 2 << 30
"""Address space of the processes below: reading /dev/zero without bound fails there at once."""


def run_nvtrain(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m nvtrain ARGS`` in a real process; a hang fails the test (and is killed), and
    so does reading without bound (the memory limit)."""
    return subprocess.run(
        [sys.executable, "-m", "nvtrain", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        preexec_fn=_limit_memory,
    )


def policy(tmp_path: Path, port: int = 29500) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(
        f'[job]\nname = "job-1"\nscript = "train.py"\n[rendezvous]\nport = {port}\n'
        f'[checkpoint]\ndir = "{tmp_path / "ckpt"}"\n',
        encoding="utf-8",
    )
    return path


# -- 6. a FIFO or a device as the policy ----------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["validate"], ["run", "--dry-run"], ["manifest"], ["tune-interval", *TIMINGS, "--policy"]],
    ids=["validate", "run", "manifest", "tune-interval"],
)
def test_a_fifo_as_policy_is_refused_at_once(tmp_path: Path, command: list[str]) -> None:
    fifo = tmp_path / "policy.toml"
    os.mkfifo(fifo)
    result = run_nvtrain(*command, str(fifo), timeout=30)  # before: blocked forever in open()
    assert result.returncode == 2
    assert "is not a regular file (it is a FIFO)" in result.stderr
    assert "Traceback" not in result.stderr


def test_dev_zero_as_policy_is_refused() -> None:
    result = run_nvtrain("validate", "/dev/zero", timeout=30)
    assert result.returncode == 2
    assert result.stderr.splitlines()[1:] == [
        "  /dev/zero: error (top level)",
        "      is not a regular file (it is a character device)",
        "      fix: give the path of the policy file itself (a FIFO, device or socket cannot be read as one)",
    ]


# -- 3. outputs onto inputs -----------------------------------------------------------------


def test_report_refuses_to_draw_over_its_events_log(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    events = run / "events.jsonl"
    shutil.copy(CPU_LOG, events)
    before = events.read_bytes()
    hard = tmp_path / "timeline.png"
    os.link(events, hard)
    for args in ([str(run), "--timeline", str(events)], [str(events), "--timeline", str(hard)]):
        result = runner.invoke(app, ["report", *args])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"nvtrain: error: --timeline {args[2]} is the events log")
        assert "  fix: give --timeline another file" in result.stderr
    assert events.read_bytes() == before


# -- 7. Ctrl-C ------------------------------------------------------------------------------


def test_keyboard_interrupt_in_a_command_is_exit_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(nvtrain.config.validation, "validate_file", interrupted)
    result = runner.invoke(app, ["validate"])
    assert result.exit_code == 130
    assert result.stderr == MESSAGE + "\n"
    assert result.stdout == ""


# Modules whose import completes at different moments of `nvtrain run --dry-run`'s start-up:
# typer's first and its core module and nvtrain's error handling (the CLI's own imports), the CLI
# package (typer then builds the command and parses: it imports pydantic for that), the policy
# model (inside the command, while pydantic builds validators) and validation.
STAGES = [
    "typer.colors",
    "typer._click.core",
    "nvtrain.cli._errors",
    "nvtrain.cli",
    "pydantic",
    "nvtrain.config.schema",
    "nvtrain.config.validation",
]


@pytest.mark.parametrize("stage", STAGES)
def test_sigint_during_start_up_is_exit_130_without_traceback(stage: str) -> None:
    """SIGINT right after ``stage`` is imported (``-X importtime`` reports each import on stderr
    as it completes), so every early window is hit on purpose rather than by timing luck."""
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "nvtrain", "run", "--dry-run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A suite started in the background by a shell without job control inherits SIGINT
        # ignored, and Python then keeps it ignored: give the child the default, as a terminal would.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == stage:
                proc.send_signal(signal.SIGINT)
                break
        else:
            pytest.fail(f"{stage} was never imported:\n{''.join(seen)}")
        _, rest = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    errors = [
        line for line in [*seen, *rest.splitlines(keepends=True)] if not line.startswith("import time:")
    ]
    assert proc.returncode == 130, "".join(errors)
    assert errors == [MESSAGE + "\n"]


# -- 8. a busy rendezvous port --------------------------------------------------------------


def test_a_held_rendezvous_port_is_a_usage_error() -> None:
    from nvtrain.launcher.ports import check_rendezvous_port

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(UsageError) as caught:
            check_rendezvous_port(port)
        assert caught.value.message.startswith(f"[rendezvous] port = {port} is in use on this node")
        assert "[rendezvous] port" in caught.value.fix
    check_rendezvous_port(port)  # free again


def test_connections_of_an_earlier_run_in_time_wait_do_not_count() -> None:
    """The store binds with SO_REUSEADDR, so the probe does too: a port whose server side closed
    its connections first (TIME_WAIT, for a minute) can be listened on again."""
    from nvtrain.launcher.ports import check_rendezvous_port

    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: it enters TIME_WAIT
    client.settimeout(30)
    assert client.recv(1) == b""  # the server's FIN has arrived: it closed first
    client.close()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("0.0.0.0", port))  # TIME_WAIT is there: a bind without SO_REUSEADDR fails
    check_rendezvous_port(port)


def test_run_on_a_held_port_exits_2_naming_it(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run_nvtrain("run", str(policy(tmp_path, port)))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"nvtrain: error: [rendezvous] port = {port} is in use on this node: the rendezvous store "
        "cannot listen on it (another run, or another program, holds it)",
        f"  fix: stop what listens on port {port}, or set another free port in [rendezvous] port",
    ]
    assert not (tmp_path / "ckpt").exists()  # refused before anything was written

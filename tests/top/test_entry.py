"""The worker's entrypoint (``python -m nvtrain.entry``), as real processes: it runs a script as
``python SCRIPT`` does (argv, ``__name__``, ``sys.path[0]``, exit codes, tracebacks, Ctrl-C),
ends it as the interpreter would (non-daemon threads, atexit handlers, files left open), and
skips the interpreter's finalization, where an object freed at exit can abort a finished rank.
The warm-start client without a server runs the script the same way. Standard-library scripts
only: no torch, a few tenths of a second each.

The same ending under the warm-start server: tests/zygote/test_zygote.py; under ft_launcher
with two ranks: tests/launcher/test_run_torchrun_style.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import nvtrain
from support.proc_helpers import BIN

SCRIPT = BIN / "ending_worker.py"

RUNNERS = {
    "entry": [sys.executable, "-m", "nvtrain.entry"],
    "client without a server": [sys.executable, "-m", "nvtrain.zygote.client"],
}


def _run(prefix: list[str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NVTRAIN_ZYGOTE", "RANK")}
    return subprocess.run(
        [*prefix, *args], env=env, cwd=cwd, text=True, capture_output=True, timeout=120, check=False
    )


def _python() -> list[str]:
    return [sys.executable]


@pytest.fixture(params=sorted(RUNNERS))
def runner(request: pytest.FixtureRequest) -> list[str]:
    return RUNNERS[request.param]


def test_an_object_that_aborts_when_finalization_frees_it_does_not_abort_the_worker(
    runner: list[str], tmp_path: Path
) -> None:
    # The control: under plain python the interpreter's finalization frees it and dies of SIGABRT.
    plain = _run(_python(), str(SCRIPT), "abort", cwd=tmp_path)
    assert plain.returncode == -signal.SIGABRT, plain
    assert "ENDING DONE" in plain.stdout
    done = _run(runner, str(SCRIPT), "abort", cwd=tmp_path)
    assert done.returncode == 0, done
    assert "ENDING DONE" in done.stdout
    assert done.stderr == "", done.stderr  # nothing it looked at on its way out warned


@pytest.mark.parametrize("mode", ["thread", "atexit", "open"])
def test_it_ends_as_the_interpreter_would(runner: list[str], tmp_path: Path, mode: str) -> None:
    # thread: a non-daemon thread that runs once the main thread is over is waited for;
    # atexit: the handlers run; open: what a file left open holds in its buffer is written.
    for name, prefix in (("python", _python()), ("nvtrain", runner)):
        out = tmp_path / f"{name}.{mode}"
        done = _run(prefix, str(SCRIPT), mode, str(out), cwd=tmp_path)
        assert done.returncode == 0, (name, done)
        assert out.read_text() == mode, (name, done)


@pytest.mark.parametrize(
    ("args", "code", "stderr"),
    [
        (("exit", "3"), 3, ""),
        (("exit", "0"), 0, ""),
        (("exit", "300"), 300 & 0xFF, ""),
        (("exit-text",), 1, "ending: a bad setting\n"),
        (("raise",), 1, "RuntimeError: boom at the end\n"),
        (("interrupt",), -signal.SIGINT, "KeyboardInterrupt\n"),
    ],
)
def test_exit_codes_and_errors_are_pythons(
    runner: list[str], tmp_path: Path, args: tuple[str, ...], code: int, stderr: str
) -> None:
    plain = _run(_python(), str(SCRIPT), *args, cwd=tmp_path)
    done = _run(runner, str(SCRIPT), *args, cwd=tmp_path)
    assert plain.returncode == done.returncode == code, (plain, done)
    assert plain.stderr.endswith(stderr) and done.stderr.endswith(stderr), (plain.stderr, done.stderr)
    if args == ("raise",):
        # The script's frames only, as python prints them: none of the entrypoint's or runpy's.
        assert "Traceback (most recent call last)" in done.stderr
        # (by path: the checkout's own folder may be named nvtrain, as the script's path shows)
        package = str(Path(nvtrain.__file__).resolve().parent)
        assert "runpy" not in done.stderr and package not in done.stderr, done.stderr
        assert done.stderr.count('  File "') == plain.stderr.count('  File "') == 1, done.stderr


def test_argv_name_and_path_are_those_of_python_script(runner: list[str], tmp_path: Path) -> None:
    plain = _run(_python(), str(SCRIPT), "exit", "0", "--flag", cwd=tmp_path)
    done = _run(runner, str(SCRIPT), "exit", "0", "--flag", cwd=tmp_path)
    line = f"name=__main__ path0={BIN} argv=['exit', '0', '--flag']"
    assert line in plain.stdout and line in done.stdout, (plain.stdout, done.stdout)


def test_a_module_runs_as_python_dash_m_runs_it(runner: list[str]) -> None:
    # From the module's folder: python -m puts the working directory first on the path.
    plain = _run([*_python(), "-m"], "ending_worker", "exit", "4", cwd=BIN)
    done = _run([*runner, "-m"], "ending_worker", "exit", "4", cwd=BIN)
    assert plain.returncode == done.returncode == 4, (plain, done)
    assert "name=__main__" in done.stdout and "argv=['exit', '4']" in done.stdout, done.stdout


def test_without_a_script_it_says_how_to_call_it(tmp_path: Path) -> None:
    done = _run(RUNNERS["entry"], cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == "usage: python -m nvtrain.entry [-m MODULE | SCRIPT] [ARGS...]"

"""The script's arguments reach it verbatim, whatever they look like, under the real ft_launcher
(NVRx 0.4.1): words that abbreviate ft_launcher's options (``--workers`` for
``--workers-stop-timeout``, ``--term``, ``--ft``) used to end the job with ft_launcher's
"ambiguous option" (exit 1) before it started. And an error of ft_launcher's own parser is exit 2
with one line that names it.

The split itself: tests/launcher/test_ftmain_args.py.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode
from nvtrain.events import EventTail
from nvtrain.launcher.identity import identify
from nvtrain.launcher.outcome import decide
from nvtrain.launcher.watch import Watch
from nvtrain.nvrx import installed_nvrx
from support.proc_helpers import BIN, LAUNCHER_MODULE, NvtrainRunner, make_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

NOOP = str(BIN / "noop_worker.py")
TRICKY = ["--workers", "4", "--workers=4", "--term", "--ft", "x", "--nnodes", "9", "-m", "y"]
"""Abbreviations of ft_launcher's options, and its own option names, as a script's arguments."""


def _args_seen(stdout: str) -> list[list[str]]:
    return [ast.literal_eval(found) for found in re.findall(r"WORKER RAN rank=\d+ args=(\[.*\])", stdout)]


def test_script_arguments_that_look_like_ft_launcher_options_reach_the_script(nvtrain: NvtrainRunner) -> None:
    # The script form, warm (the default): the words go through the warm-start client.
    run = nvtrain.start("--max-restarts", "0", NOOP, *TRICKY, "--monitor-interval", "5")
    assert run.wait(timeout=180) == 0, run.describe()
    assert _args_seen(run.stdout) == [[*TRICKY, "--monitor-interval", "5"]], run.describe()
    assert "ambiguous option" not in run.stderr, run.describe()


def test_job_args_and_arguments_after_the_policy_reach_the_script(
    nvtrain: NvtrainRunner, tmp_path: Path
) -> None:
    # A policy's [job] args, then the words after `--`; cold workers (nvtrain.entry).
    policy, _ = make_policy(tmp_path, script=NOOP, args=TRICKY, nproc=1, max_restarts=0)
    run = nvtrain.start(str(policy), "--", "--term", "--ft=1")
    assert run.wait(timeout=180) == 0, run.describe()
    assert _args_seen(run.stdout) == [[*TRICKY, "--term", "--ft=1"]], run.describe()


def test_an_error_of_ft_launchers_parser_is_exit_2_with_its_message(tmp_path: Path) -> None:
    # What nvtrain's own options can no longer cause, an NVRx that lacks an option can: its
    # parser's error is exit 2 (argparse's), with one line instead of ft_launcher's usage.
    argv = [sys.executable, "-m", "nvtrain.nvrx.ftmain", LAUNCHER_MODULE, "--no-such-option=1"]
    argv += ["-m", "nvtrain.entry", NOOP, "--workers", "4"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 2, done.stderr
    line = "nvtrain ftmain: usage error: ft_launcher refused its command line: unrecognized arguments: "
    assert line + "--no-such-option=1\n" in done.stderr, done.stderr
    assert "usage:" not in done.stderr and "WORKER RAN" not in done.stdout, done.stderr
    # The supervisor reads that line from ft_launcher's output: nvtrain run ends with exit 2 (a
    # usage error, not retried), not exit 1 ("budget spent", which Kubernetes retries).
    policy = Policy.model_validate(
        {"job": {"name": "usage", "script": NOOP}, "checkpoint": {"dir": str(tmp_path / "ckpt")}}
    )
    seen = Watch(policy, EventTail(tmp_path / "events.jsonl"), lambda r: None, node=0, host="vm")
    seen.launcher_started()
    for text in done.stderr.splitlines(keepends=True):
        seen.line(text, stream="stderr")
    ident = identify(policy, {"NVTRAIN_RUN_ID": "usage-1"}, hostname="vm")
    outcome = decide(done.returncode, seen, policy, ident, "127.0.0.1:29500", installed_nvrx())
    assert outcome.exit_code == ExitCode.USAGE == 2, outcome
    assert "unrecognized arguments: --no-such-option=1" in outcome.cause, outcome

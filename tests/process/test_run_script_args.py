"""The script's arguments reach it verbatim, whatever they look like, under the real ft_launcher
(NVRx 0.4.1): words that abbreviate ft_launcher's options (``--workers`` for
``--workers-stop-timeout``, ``--term``, ``--ft``) used to end the job with ft_launcher's
"ambiguous option" (exit 1) before it started. And an error of ft_launcher's own parser is exit 2
with one line that names it.

The split itself: tests/unit/test_ftmain_args.py.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from proc_helpers import BIN, LAUNCHER_MODULE, NvtrainRunner, make_policy

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
    argv = [sys.executable, "-m", "nvtrain.launcher.ftmain", LAUNCHER_MODULE, "--no-such-option=1"]
    argv += ["-m", "nvtrain.entry", NOOP, "--workers", "4"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 2, done.stderr
    line = "nvtrain ftmain: usage error: ft_launcher refused its command line: unrecognized arguments: "
    assert line + "--no-such-option=1\n" in done.stderr, done.stderr
    assert "usage:" not in done.stderr and "WORKER RAN" not in done.stdout, done.stderr

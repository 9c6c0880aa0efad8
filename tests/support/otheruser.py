"""Acting as another user (``nobody``, uid 65534, through ``setpriv``) with this checkout's
Python: possible only where that user can reach the interpreter and the installed packages.

A checkout inside a folder that only its owner may enter (a home of mode 0700, ``mktemp -d``)
keeps ``nobody`` out of ``.venv`` and ``src``: a test that runs this Python as ``nobody`` is then
skipped, saying so, rather than failing on ``No module named ...`` (the check is what the test
would do: import the modules it needs, as ``nobody``)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

import pytest

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@functools.cache
def _why_not(modules: tuple[str, ...]) -> str | None:
    if os.geteuid() != 0:
        return "acting as another user (nobody) needs root"
    if shutil.which("setpriv") is None:
        return "needs setpriv (util-linux) to act as another user"
    done = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", f"import {', '.join(modules)}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return (
            f"nobody cannot run {sys.executable} with {', '.join(modules)} ({last}): the checkout "
            "lies in a folder other users cannot enter (clone it under /tmp or /srv to run this test)"
        )
    return None


def skip_unless_nobody_can_import(*modules: str) -> None:
    """Skip the calling test, with the reason, unless ``nobody`` can run this Python and import
    ``modules``."""
    why = _why_not(tuple(modules) or ("nvtrain",))
    if why is not None:
        pytest.skip(why)

"""The script gets the user's ``$TMPDIR`` back from ``nvtrain.entry``.

ft_launcher runs with a private ``$TMPDIR`` of the run's (``NVTRAIN_USER_TMPDIR`` holds the
user's, empty when it was unset); ``nvtrain.entry.run``, which cold workers (``python -m
nvtrain.entry``) and warm ones (forked from a server that may have asked ``tempfile`` already)
both go through, restores it before the script runs. Real interpreters, standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import json, os, sys, tempfile
print(json.dumps({"TMPDIR": os.environ.get("TMPDIR"), "gettempdir": tempfile.gettempdir(),
                  "marker": os.environ.get("NVTRAIN_USER_TMPDIR")}))
"""

# As the warm-start server does: tempfile asked (and remembered) the launcher's folder before the
# fork; the child takes the client's environment, then calls run().
WARM = """
import os, sys, tempfile
tempfile.gettempdir()
from nvtrain.entry import finish, parse, run
finish(run(parse(sys.argv[1:]), own_path=False))
"""


def _seen(tmp_path: Path, env: dict[str, str], warm: bool) -> dict[str, str | None]:
    script = tmp_path / "show.py"
    script.write_text(SCRIPT, encoding="utf-8")
    base = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "NVTRAIN_USER_TMPDIR")}
    head = [sys.executable, "-c", WARM] if warm else [sys.executable, "-m", "nvtrain.entry"]
    done = subprocess.run(
        [*head, str(script)], env={**base, **env}, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    seen: dict[str, str | None] = json.loads(done.stdout)
    return seen


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    launchers, users = tmp_path / "launcher-tmp", tmp_path / "user-tmp"
    launchers.mkdir(mode=0o700)
    users.mkdir()
    return launchers, users


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_the_script_sees_the_users_tmpdir(tmp_path: Path, folders: tuple[Path, Path], warm: bool) -> None:
    launchers, users = folders
    seen = _seen(tmp_path, {"TMPDIR": str(launchers), "NVTRAIN_USER_TMPDIR": str(users)}, warm)
    assert seen == {"TMPDIR": str(users), "gettempdir": str(users), "marker": None}
    # Not started by nvtrain run (no NVTRAIN_USER_TMPDIR): TMPDIR is left as it is.
    seen = _seen(tmp_path, {"TMPDIR": str(users)}, warm)
    assert seen == {"TMPDIR": str(users), "gettempdir": str(users), "marker": None}


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_an_unset_tmpdir_stays_unset(tmp_path: Path, folders: tuple[Path, Path], warm: bool) -> None:
    launchers, _ = folders
    seen = _seen(tmp_path, {"TMPDIR": str(launchers), "NVTRAIN_USER_TMPDIR": ""}, warm)
    assert seen["TMPDIR"] is None and seen["marker"] is None
    assert seen["gettempdir"] != str(launchers)

"""``EventLog.__del__`` lets go of the folder's descriptor and never raises: not for a log whose
``__init__`` failed before it opened the folder, nor for one whose descriptor was closed behind
its back. Run in a process of its own, whose stderr would hold Python's "Exception ignored in"
report of a finalizer that raised."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_SCRIPT = r"""
import gc, os, sys
from pathlib import Path

from nvtrain.events import EventLog

root = Path(sys.argv[1])
(root / "a-file").write_text("")
try:
    EventLog(root / "a-file" / "events.jsonl")  # its folder cannot be made
except OSError:
    pass
else:
    raise SystemExit("made a log under a file")
gc.collect()

log = EventLog(root / "ok" / "events.jsonl")
folder = log._folder
del log
gc.collect()
try:
    os.fstat(folder)
except OSError:
    print("released")

log = EventLog(root / "ok" / "events.jsonl")
os.close(log._folder)  # closed behind its back
del log
gc.collect()
print("done")
"""


def test_the_finalizer_releases_the_folder_and_never_raises(tmp_path: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["released", "done"], ran.stdout
    assert ran.stderr == "", ran.stderr

"""Waits to be interrupted: writes ``<dir>/ready-<rank>`` once running, and on KeyboardInterrupt
(SIGINT) writes ``<dir>/saved-<rank>`` (a script's "save on Ctrl-C") and exits 130. A SIGTERM
kills it without the marker. No torch import. Argument: the directory."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# One write per line: the ranks share the launcher's pipe, and with PYTHONUNBUFFERED a print
# is two writes (text, newline) that another rank's line can come between.
sys.stdout.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]

directory = Path(sys.argv[1])
rank = os.environ["RANK"]
try:
    (directory / f"ready-{rank}").write_text(str(os.getpid()), encoding="utf-8")
    while True:
        time.sleep(1)
except KeyboardInterrupt:
    (directory / f"saved-{rank}").write_text("saved", encoding="utf-8")
    print(f"WORKER SAVED rank={rank}", flush=True)
    sys.exit(130)

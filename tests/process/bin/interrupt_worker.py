"""Waits to be interrupted: writes ``<dir>/ready-<rank>`` once running, and on KeyboardInterrupt
(SIGINT) writes ``<dir>/saved-<rank>`` (a script's "save on Ctrl-C") and exits 130. A SIGTERM
kills it without the marker. No torch import. Argument: the directory."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

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

"""A worker that meets a worker of another job running beside it on this machine.

``meet_worker.py DIR ME PEER``: writes ``DIR/ME``, then waits until ``DIR/PEER`` exists (at most
60 s: exit 1 with ``NO PEER``). Prints ``MET ME PEER``, and exits 0 once it has met the peer.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

# One write per line: the ranks share the launcher's pipe, and with PYTHONUNBUFFERED a print
# is two writes (text, newline) that another rank's line can come between.
sys.stdout.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]

folder, me, peer = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(folder / f"{me}.tmp").write_text("here", encoding="utf-8")
(folder / f"{me}.tmp").rename(folder / me)
deadline = time.monotonic() + 60
while not (folder / peer).exists():
    if time.monotonic() > deadline:
        print(f"NO PEER {me} {peer}", flush=True)
        sys.exit(1)
    time.sleep(0.05)
print(f"MET {me} {peer}", flush=True)

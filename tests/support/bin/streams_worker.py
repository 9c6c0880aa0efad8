"""Each rank prints ``STREAM OUT rank=N`` to stdout and ``STREAM ERR rank=N`` to stderr, and a
line in the launcher's log format (a worker's own, not the launcher's: it must stay visible), then
exits 0. No torch import."""

from __future__ import annotations

import os
import sys

# One write per line, on both streams: the ranks share the launcher's pipes, and with
# PYTHONUNBUFFERED a print is two writes (text, newline) that another rank's line can come
# between (seen on stderr under stress-ng: "STREAM ERR rank=1STREAM ERR rank=0\n\n").
for stream in (sys.stdout, sys.stderr):
    stream.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]

rank = os.environ["RANK"]
print(f"STREAM OUT rank={rank}", flush=True)
print(f"STREAM ERR rank={rank}", file=sys.stderr, flush=True)
print(f"[rank{rank}] [INFO] step 1 STREAM OWN LOG rank={rank}", file=sys.stderr, flush=True)

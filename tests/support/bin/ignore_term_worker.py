"""A worker that ignores SIGTERM and sleeps: only SIGKILL stops it. Marker: ``WORKER READY``."""

from __future__ import annotations

import os
import signal
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
# One write per marker, so that two workers sharing the pipe cannot split each other's lines.
os.write(1, f"WORKER READY rank={os.environ['RANK']} pid={os.getpid()}\n".encode())
time.sleep(120)
print("WORKER NOT STOPPED", flush=True)

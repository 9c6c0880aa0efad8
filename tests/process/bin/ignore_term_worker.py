"""A worker that ignores SIGTERM and sleeps: only SIGKILL stops it. Marker: ``WORKER READY``."""

from __future__ import annotations

import os
import signal
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"WORKER READY rank={os.environ['RANK']} pid={os.getpid()}", flush=True)
time.sleep(120)
print("WORKER NOT STOPPED", flush=True)

"""Stands in for an ft_launcher that ignores SIGTERM while it restarts: SIGTERM ignored, it starts
a new "worker" every 0.1 s (``ROUND n pid=P``, the worker in a session of its own, as torch
elastic starts them). Worker 0 ignores SIGTERM too; worker 1 stops itself (SIGSTOP)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

WORKER = r"""
import os, signal, sys, time
n = int(sys.argv[1])
# An ignored signal stays ignored across fork and exec: the launcher's SIG_IGN is this worker's
# too unless it puts SIGTERM back.
signal.signal(signal.SIGTERM, signal.SIG_IGN if n == 0 else signal.SIG_DFL)
print(f"WORKER {n} pid={os.getpid()}", flush=True)
if n == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(60)
"""


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    workers = []
    for n in range(1000):
        workers.append(subprocess.Popen([sys.executable, "-c", WORKER, str(n)], start_new_session=True))
        print(f"ROUND {n} pid={workers[-1].pid}", flush=True)
        time.sleep(0.1)


if __name__ == "__main__":
    main()

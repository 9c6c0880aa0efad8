"""A call the script must change: the rank ends at once with exit 2, not retried.

The in-process layer retries whatever ``main`` raises until its attempts run out, and then the
in-job layer starts the workers again: right for faults, useless for a call that is refused
every time (a framework integration's ``Refused``: an argument nvtrain owns, an unsupported
strategy or framework version). ``refuse`` ends the rank at the first attempt instead: a
``worker_gave_up`` event whose reason is the error, one line on stderr, exit 2
(``errors.ExitCode.USAGE``). The launcher reads that pair, a worker that exited 2 after it
logged ``worker_gave_up``, as a usage error: it stops the run and ends with exit 2, the error in
its cause (``launcher/watch.py``, ``launcher/outcome.py``).
"""

from __future__ import annotations

import contextlib

from nvtrain.errors import ExitCode
from nvtrain.events import EventLog
from nvtrain.events.records import WorkerGaveUp
from nvtrain.worker import stopping
from nvtrain.worker.settings import say

__all__ = ["refuse"]


def refuse(events: EventLog | None, rank: int, error: str) -> None:
    """End this rank with exit 2 now, ``error`` in the events log and on stderr. Never returns."""
    reason = f"usage error: {error}"
    if events is not None:
        with contextlib.suppress(Exception):  # an unwritable log must not turn this into a retry
            events.emit(WorkerGaveUp(rank=rank, reason=reason))
    say(reason, prefix=f"nvtrain: rank {rank}: ")
    stopping.exit_with(int(ExitCode.USAGE))

"""Writing the run's events log (JSON lines, append-only): the launcher and the workers.

Each line is written with one ``write`` call on an O_APPEND descriptor, so processes on one node
can share the file without interleaving lines.

A full or failing volume must not stop whoever writes: an ``EventLog`` with a ``report``
callback reports the first failed write of a streak (``EventsLogError``), drops events until a
write succeeds again (space may come back), then reports how many it dropped
(``EventsLogResumed``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvtrain.events.records import SCHEMA_VERSION, Event, EventsLogError, EventsLogResumed

__all__ = ["EventLog", "Reporter"]

Reporter = Callable[[Event], None]
"""Called with each event to show (written to the log or not); the CLI renders it."""


class EventLog:
    """Appends events to one file; safe to share between processes on one node (O_APPEND).

    ``common`` fields (``node``, ``run_id``, ``source``; ``host`` and ``pid`` are added) go into
    every line. Without ``report`` (set it after construction), a failed write raises
    ``OSError``. With it, ``emit`` never does: see the module's doc. A line cut short by a full
    volume is ended before the next one is written, so readers skip it alone.
    """

    def __init__(self, path: Path, **common: Any) -> None:
        self.path = path
        # A warm-started worker is known to ft_launcher by the pid of the client that stands in
        # for it (nvtrain.zygote): its events carry that pid.
        pid = os.environ.get("NVTRAIN_PID", "")
        self.common = {
            "host": socket.gethostname(),
            "pid": int(pid) if pid.isdigit() else os.getpid(),
            **common,
        }
        self.report: Reporter | None = None
        self.dropped = 0
        """Events dropped since the last write that succeeded (with ``report`` only)."""
        self._torn = False
        self._lock = threading.RLock()  # re-entrant: a signal handler may emit during an emit
        path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, event: Event) -> dict[str, Any]:
        """Append ``event`` (stamped now unless its ``ts`` is set); returns the line's fields."""
        if not event.LOGGED:
            raise ValueError(f"{event.name} events are shown, never logged")
        record = {
            "ts": event.ts or round(time.time(), 6),
            "event": event.name,
            "v": SCHEMA_VERSION,
            **self.common,
            **({"rank": event.rank} if event.rank is not None else {}),
            **event.fields(),
        }
        line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                self._append(b"\n" + line if self._torn else line)
            except OSError as exc:
                if self.report is None:
                    raise
                if self.dropped == 0:
                    self._tell(EventsLogError(error=f"{exc.strerror or exc} (errno {exc.errno})"))
                self.dropped += 1
                return record
            if self.dropped:
                self._tell(EventsLogResumed(dropped=self.dropped))
                self.dropped = 0
        return record

    def _append(self, data: bytes) -> None:
        """Write ``data`` at the end of the file (one ``write`` unless the volume is full)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError:
            if written:  # part of the line made it: the next write must end it first
                self._torn = not data[:written].endswith(b"\n")
            raise
        finally:
            os.close(fd)
        self._torn = False

    def _tell(self, event: EventsLogError | EventsLogResumed) -> None:
        assert self.report is not None
        with contextlib.suppress(OSError):  # the reporter's own output may be failing too
            self.report(dataclasses.replace(event, path=str(self.path), ts=time.time()))

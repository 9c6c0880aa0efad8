"""Writing the run's events log (JSON lines, append-only): the launcher and the workers.

Each line is written with one ``write`` call on an O_APPEND descriptor, so processes on one node
can share the file without interleaving lines.

The file is opened relative to a descriptor of its folder taken when the log is made (the folder
must be this user's, in folders safe from ``/`` down: ``private.open_folder``), never through a
link (``O_NOFOLLOW``), and only when it is a regular file of this user's. A folder that another
user could have swapped since (the path leads to another folder now), a link or another user's
file in place of the log: the line is not written, and the write fails with ``private.NotPrivate``
(an ``OSError``) saying why; nothing is written anywhere else.

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

from nvtrain import private
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
        if private.unsafe_ancestor(path.parent) is None:  # (else nothing is made: refused below)
            path.parent.mkdir(parents=True, exist_ok=True)
        self._folder: int | None = None
        self._folder_id = (0, 0)
        self._refused: private.NotPrivate | None = None
        """Why no line is ever written (the folder was not safe when the log was made)."""
        try:
            self._folder = private.open_folder(path.parent)
        except private.NotPrivate as exc:
            self._refused = exc
        else:
            info = os.fstat(self._folder)
            self._folder_id = (info.st_dev, info.st_ino)

    def close(self) -> None:
        """Let go of the folder's descriptor (a later ``emit`` fails)."""
        folder, self._folder = self._folder, None
        if folder is not None:
            os.close(folder)
        if self._refused is None:
            self._refused = private.NotPrivate(self.path, "belongs to an events log that was closed")

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        # A finalizer must not raise, and may run late in the interpreter's shutdown, when this
        # module's globals are gone: os.close is bound as a default. ``_folder`` is missing when
        # __init__ failed before it (the folder could not be made); OSError (EBADF) when the
        # descriptor was closed already behind the log's back (an os.closerange in a child).
        folder = getattr(self, "_folder", None)
        if folder is not None:
            try:
                _close(folder)
            except OSError:
                pass

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
                    code = f" (errno {exc.errno})" if exc.errno is not None else ""
                    self._tell(EventsLogError(error=f"{exc.strerror or exc}{code}"))
                self.dropped += 1
                return record
            if self.dropped:
                self._tell(EventsLogResumed(dropped=self.dropped))
                self.dropped = 0
        return record

    def _append(self, data: bytes) -> None:
        """Write ``data`` at the end of the file (one ``write`` unless the volume is full), in the
        folder the log was made in, while the path still leads to that folder."""
        if self._refused is not None:
            raise self._refused
        assert self._folder is not None
        try:
            now = os.stat(self.path.parent)
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != self._folder_id:
            raise private.NotPrivate(
                self.path.parent,
                "is not the folder this events log was opened in any more (removed, renamed or "
                "replaced): no line is written there",
            )
        fd = private.open_append(self._folder, self.path.name, self.path)
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

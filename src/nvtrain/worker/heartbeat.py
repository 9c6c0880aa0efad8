"""Per-rank heartbeats to ft_launcher's rank monitor (NVRx ``RankMonitorClient``).

Two NVRx pitfalls are handled here: a heartbeat is sent right after monitoring starts (a worker
that dies before its first heartbeat otherwise leaves its monitor rejecting every later one),
and long operations (checkpoint save and load, evaluation) run inside ``paused()``, which keeps
beating from a thread up to a limit, so a slow checkpoint never looks like a hang while a real
hang inside it is still caught.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Heartbeat"]


class Heartbeat:
    """Heartbeats for one rank; a no-op when the process is not under ft_launcher."""

    def __init__(self, enabled: bool, interval: float) -> None:
        self.enabled = enabled
        self.interval = interval
        self._client: Any = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if not self.enabled or self._client is not None:
            return
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        client = RankMonitorClient()
        client.init_workload_monitoring()
        client.send_heartbeat()
        self._client = client

    def beat(self) -> None:
        if self._client is not None:
            with self._lock:
                self._client.send_heartbeat()

    def stop(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.shutdown_workload_monitoring()
            self._client = None

    @contextlib.contextmanager
    def paused(self, limit: float) -> Iterator[None]:
        """Keep beating from a thread for at most ``limit`` seconds while the body runs."""
        if self._client is None:
            yield
            return
        done = threading.Event()

        def keep_alive() -> None:
            waited = 0.0
            while waited < limit and not done.wait(min(self.interval, limit - waited)):
                waited += self.interval
                with contextlib.suppress(Exception):
                    self.beat()

        thread = threading.Thread(target=keep_alive, name="nvtrain-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self.beat()

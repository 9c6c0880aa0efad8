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
        self._startup: threading.Event | None = None

    def start(self, startup_limit: float = 0.0) -> None:
        """Connect to the rank monitor and send the first heartbeat at once. Then, until the
        first ``step()`` (at most ``startup_limit`` seconds: the policy's initial timeout),
        keep beating from a thread, so start-up, model build and restore are judged by the
        initial timeout, not by the shorter steady-state one."""
        if not self.enabled or self._client is not None:
            return
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        client = RankMonitorClient()
        client.init_workload_monitoring()
        client.send_heartbeat()
        self._client = client
        if startup_limit > 0:
            self._startup = threading.Event()
            threading.Thread(
                target=self._keep_alive,
                args=(self._startup, startup_limit),
                name="nvtrain-heartbeat-startup",
                daemon=True,
            ).start()

    def _keep_alive(self, done: threading.Event, limit: float) -> None:
        waited = 0.0
        while waited < limit and not done.wait(min(self.interval, limit - waited)):
            waited += self.interval
            with contextlib.suppress(Exception):
                self.beat()

    def step(self) -> None:
        """A training step finished: beat, and end the start-up keep-alive."""
        if self._startup is not None:
            self._startup.set()
            self._startup = None
        self.beat()

    def beat(self) -> None:
        if self._client is not None:
            with self._lock:
                self._client.send_heartbeat()

    def stop(self) -> None:
        if self._startup is not None:
            self._startup.set()
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
        thread = threading.Thread(
            target=self._keep_alive, args=(done, limit), name="nvtrain-heartbeat", daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self.beat()

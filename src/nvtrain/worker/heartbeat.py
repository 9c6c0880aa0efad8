"""Per-rank heartbeats to ft_launcher's rank monitor (``nvrx.rank_monitor``).

Two NVRx pitfalls are handled here: a heartbeat is sent right after monitoring starts (a worker
that dies before its first heartbeat otherwise leaves its monitor rejecting every later one),
and long operations (checkpoint save and load, evaluation) run inside ``paused()``, which keeps
beating from a thread up to a limit, so a slow checkpoint never looks like a hang while a real
hang inside it is still caught.

When the policy fixes no ``[heartbeat] timeout``, NVRx computes the timeouts from the heartbeat
intervals it observed, when the workers ask (``calculate_timeouts``, a collective), as NVRx's own
examples do; until then the rank monitors have no fixed timeout. The keep-alive threads beat at
least four times per steady-state timeout the rank monitor applies.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from nvtrain.nvrx.rank_monitor import RankMonitor

__all__ = ["KEEP_ALIVE_FALLBACK", "Heartbeat"]

KEEP_ALIVE_FALLBACK = 1200.0
"""How long the keep-alive threads (start-up, ``paused``) beat when the policy sets no heartbeat
timeout to bound them: 20 minutes. Past it, a hang inside is caught by NVRx's timeouts."""


class Heartbeat:
    """Heartbeats for one rank; a no-op when the process is not under ft_launcher."""

    def __init__(self, enabled: bool, interval: float) -> None:
        self.enabled = enabled
        self.base_interval = interval
        self.interval = interval
        """Seconds between keep-alive beats: ``interval``, or a quarter of the rank monitor's
        steady-state timeout when that is shorter (a computed one may well be)."""
        self._client: RankMonitor | None = None
        self._lock = threading.Lock()
        self._startup: threading.Event | None = None

    def _follow(self) -> None:
        """Beat often enough for the steady-state timeout NVRx applies now."""
        steady = None if self._client is None else self._client.steady_timeout()
        self.interval = self.base_interval if steady is None else min(self.base_interval, steady / 4)

    def calculate_timeouts(self, initial: float | None, floor: float = 0.0) -> bool:
        """Ask NVRx to compute the heartbeat timeouts from the intervals observed so far (the
        longest, times its ``safety_factor``; averaged with the previous computed values):
        a collective (MAX all-reduce on the default process group), so every rank calls it at
        the same step. Returns whether they were set (False: not enough data yet).

        NVRx's initial timeout comes out as a few milliseconds here: it measures up to the
        first heartbeat, which this class sends right after connecting. It is replaced by
        ``initial`` (the policy's), or else by the steady-state timeout, so that a replaced
        worker is not killed between connecting and its first heartbeat. Both timeouts are at
        least ``floor``: the stretches NVRx cannot have observed (an in-process restart) must
        not look like a hang. Raises what NVRx raises."""
        if self._client is None:
            return False
        with self._lock:
            if not self._client.calculate_timeouts(initial, floor):
                return False
            self._follow()
        return True

    def start(self, startup_limit: float = 0.0) -> None:
        """Connect to the rank monitor and send the first heartbeat at once. Then, until the
        first ``step()`` (at most ``startup_limit`` seconds: the policy's initial timeout),
        keep beating from a thread, so start-up, model build and restore are judged by the
        initial timeout, not by the shorter steady-state one."""
        if not self.enabled or self._client is not None:
            return
        self._client = RankMonitor.connect()
        self._follow()  # timeouts a previous worker had computed stay with the rank monitor
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
        while waited < limit:
            every = self.interval
            if done.wait(min(every, limit - waited)):
                break
            waited += every
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
                self._client.beat()

    def stop(self) -> None:
        if self._startup is not None:
            self._startup.set()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
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

"""The rank-monitor client: one rank's connection to ft_launcher's rank monitor (NVRx's
``RankMonitorClient``), as ``worker/heartbeat.py`` uses it.

The calls and names it relies on are part of each NVRx version's contract. NVRx is imported when
a connection is made, not at import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RankMonitor"]


class RankMonitor:
    """A rank's monitoring session: started by :meth:`connect`, ended by :meth:`close`."""

    def __init__(self, client: Any) -> None:
        self._client = client

    @classmethod
    def connect(cls) -> RankMonitor:
        """Start monitoring this rank and send its first heartbeat at once (a worker that dies
        before its first heartbeat otherwise leaves its monitor rejecting every later one)."""
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        client = RankMonitorClient()
        client.init_workload_monitoring()
        client.send_heartbeat()
        return cls(client)

    def beat(self) -> None:
        self._client.send_heartbeat()

    def close(self) -> None:
        self._client.shutdown_workload_monitoring()

    def steady_timeout(self) -> float | None:
        """The steady-state heartbeat timeout the rank monitor applies now, if any."""
        steady = getattr(getattr(self._client, "hb_timeouts", None), "subsequent", None)
        return float(steady) if isinstance(steady, int | float) and steady > 0 else None

    def calculate_timeouts(self, initial: float | None, floor: float) -> bool:
        """Have NVRx compute the heartbeat timeouts from the intervals it observed (a collective:
        every rank calls it at the same step); then make the initial one ``initial`` (or the
        steady-state one) and both at least ``floor``. False: not enough data yet."""
        client = self._client
        if not client.calculate_and_set_hb_timeouts(skip_if_not_ready=True):
            return False
        computed = client.hb_timeouts
        subsequent = max(computed.subsequent, floor)
        first = initial if initial is not None else max(computed.initial, subsequent)
        first = max(first, floor)
        if (computed.initial, computed.subsequent) != (first, subsequent):
            # load_state_dict is NVRx's public way to hand computed timeouts to the monitor.
            heartbeat = {"initial": first, "subsequent": subsequent, "were_calculated": True}
            client.load_state_dict({client.CURRENT_TIMEOUTS_STATE_KEY: {"heartbeat": heartbeat}})
        return True

"""Updates of the live figures that failed: counted, and each distinct error logged once.

The server's thread rebuilds the figures from the events log every refresh. An update that
fails (a log on shared storage that cannot be read for a moment, or a bug in building the
figures) leaves the figures as they were and the endpoint serving; it must not go unseen, nor
fill the pod's log: each failed update is counted (served as ``nvtrain_metrics_errors_total``),
and each distinct error (its type and message) is logged once, at warning level, through the
logger ``nvtrain.live`` (``nvtrain run`` shows it on its stderr).
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

__all__ = ["ERRORS_HELP", "ERRORS_METRIC", "LOGGER", "MAX_LOGGED", "UpdateErrors"]

LOGGER = logging.getLogger("nvtrain.live")
ERRORS_METRIC = "nvtrain_metrics_errors"
"""The counter of failed updates (served with ``_total``), on every pod."""
ERRORS_HELP = (
    "Updates of the live figures that failed (the figures then stay as they were); each distinct "
    "error is logged once on nvtrain run's stderr."
)
MAX_LOGGED = 20
"""Distinct errors logged at most; further ones are still counted."""


class Updatable(Protocol):
    def update(self) -> bool: ...


class UpdateErrors:
    """The failed updates of one server (``update`` runs one and records its failure)."""

    def __init__(self, logger: logging.Logger = LOGGER) -> None:
        self._logger = logger
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str]] = set()
        self._count = 0

    @property
    def count(self) -> int:
        """Failed updates so far."""
        return self._count

    def update(self, figures: Updatable, what: str) -> None:
        """``figures.update()``; never raises: a failure is recorded (``record``) and the
        figures stay as they were. ``what`` names the figures in the log line."""
        try:
            figures.update()
        except Exception as exc:  # noqa: BLE001 - any: the endpoint goes on serving whatever failed
            self.record(exc, what)

    def record(self, exc: Exception, what: str) -> None:
        """Count a failed update; log ``exc`` if no error of its type and message was logged."""
        key = (type(exc).__name__, str(exc))
        with self._lock:
            self._count += 1
            new = key not in self._seen and len(self._seen) < MAX_LOGGED
            if new:
                self._seen.add(key)
            last = new and len(self._seen) == MAX_LOGGED
        if not new:
            return
        self._logger.warning(
            "metrics: updating the %s figures failed: %s: %s (logged once; every failed update "
            "counts in %s_total; the figures stay as they were and the endpoint goes on serving)",
            what,
            key[0],
            key[1],
            ERRORS_METRIC,
            exc_info=exc,
        )
        if last:
            self._logger.warning(
                "metrics: %d distinct update errors logged; further ones are only counted", MAX_LOGGED
            )

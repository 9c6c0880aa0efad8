"""What a worker knows about its run: the resolved policy, run id, events log and its rank.

``nvtrain run`` passes these through the environment (``NVTRAIN_POLICY``, ``NVTRAIN_RUN_ID``,
``NVTRAIN_EVENTS``); ft_launcher adds the torchrun variables. A script started without nvtrain
(``python train.py``) gets a one-rank run with the built-in defaults, for debugging.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from nvtrain.config.schema import Policy
from nvtrain.events import Event, EventLog
from nvtrain.events.records import EventsLogError, EventsLogResumed

__all__ = ["LOGGER", "WorkerSettings", "load_settings", "say"]

LOGGER = logging.getLogger("nvtrain.worker")
"""The worker library's logger: every line it writes for the pod's log is a ``WARNING`` record
here (see docs/worker.md, "Logging")."""


class _Fallback(logging.Handler):
    """Writes a record as ``nvtrain worker rank <RANK>: <message>`` to stderr (ft_launcher passes
    it to the pod's log) unless the application gave ``nvtrain.worker`` a handler of its own (or
    the child logger the record comes from). Handlers above it (``nvtrain``, the root logger's)
    do not count: records propagate to them as well (an application's ``logging.basicConfig()``
    sees them), and the pod's log keeps its lines whatever those do (pytest's capture, for one,
    sits on the root logger). A failing stderr is ignored (these lines only ever report a
    problem)."""

    def emit(self, record: logging.LogRecord) -> None:
        if self._others(record.name):
            return
        prefix = getattr(record, "prefix", None)
        if prefix is None:
            prefix = f"nvtrain worker rank {getattr(record, 'rank', '0')}: "
        with contextlib.suppress(OSError, ValueError):
            # (one write, newline included: the other ranks' lines share the stream)
            sys.stderr.write(f"{prefix}{record.getMessage()}\n")
            sys.stderr.flush()

    def _others(self, name: str) -> bool:
        """Whether a handler other than this one is on the record's way from ``name`` up to
        ``nvtrain.worker``."""
        logger: logging.Logger | None = logging.getLogger(name)
        while logger is not None:
            if any(handler is not self for handler in logger.handlers):
                return True
            if logger is LOGGER or not logger.propagate:
                return False
            logger = logger.parent
        return False


if not any(isinstance(handler, _Fallback) for handler in LOGGER.handlers):
    LOGGER.addHandler(_Fallback())


def say(message: str, *, prefix: str | None = None) -> None:
    """One ``WARNING`` record on the ``nvtrain.worker`` logger, with this worker's rank
    (``record.rank``); by default one line on stderr, prefixed with the rank (``prefix``
    replaces that prefix there)."""
    rank = os.environ.get("RANK", "0")
    extra: dict[str, object] = {"rank": rank}
    if prefix is not None:
        extra["prefix"] = prefix
    LOGGER.warning("%s", message, extra=extra, stacklevel=2)


def _report_events_log(event: Event) -> None:
    """An ``EventLog`` problem in one line: a worker goes on training when its events log cannot
    be written (a full or read-only checkpoint volume); the events are dropped meanwhile."""
    if isinstance(event, EventsLogError):
        say(
            f"cannot write the events log {event.path}: {event.error}; training goes on, "
            "its events are dropped until the log can be written again"
        )
    elif isinstance(event, EventsLogResumed):
        say(f"the events log {event.path} is written again; {event.dropped} event(s) were dropped")


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    policy: Policy
    run_id: str
    events_path: Path | None
    under_launcher: bool
    """True when an ft_launcher rank monitor is there to receive heartbeats."""
    node: int | None = None
    """This pod's node rank (``NVTRAIN_NODE_RANK``): its launcher tells its workers' events by it."""

    def events(self, **common: object) -> EventLog | None:
        if self.events_path is None:
            return None
        if self.node is not None:
            common.setdefault("node", self.node)
        log = EventLog(self.events_path, run_id=self.run_id, source="worker", **common)
        log.report = _report_events_log  # a failed write is reported once, never raised
        return log


def load_settings(env: Mapping[str, str] | None = None) -> WorkerSettings:
    """Settings from the environment; falls back to a debug run when nvtrain did not start us."""
    env = os.environ if env is None else env
    path = env.get("NVTRAIN_POLICY")
    if path:
        policy = Policy.model_validate_json(Path(path).read_text(encoding="utf-8"))
    else:
        policy = Policy.model_validate(
            {
                "job": {"name": "debug", "script": "-"},
                "restart": {"in_process": {"enabled": False}},
                "checkpoint": {"dir": str(Path.cwd() / "checkpoints")},
            }
        )
    run_id = env.get("NVTRAIN_RUN_ID") or "debug"
    events = env.get("NVTRAIN_EVENTS")
    return WorkerSettings(
        policy=policy,
        run_id=run_id,
        events_path=Path(events) if events else None,
        under_launcher=bool(env.get("FT_RANK_MONITOR_IPC_SOCKET")),
        node=int(node) if (node := env.get("NVTRAIN_NODE_RANK", "")).isdigit() else None,
    )

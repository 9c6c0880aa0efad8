"""What a worker knows about its run: the resolved policy, run id, events log and its rank.

``nvtrain run`` passes these through the environment (``NVTRAIN_POLICY``, ``NVTRAIN_RUN_ID``,
``NVTRAIN_EVENTS``); ft_launcher adds the torchrun variables. A script started without nvtrain
(``python train.py``) gets a one-rank run with the built-in defaults, for debugging.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from nvtrain.config.schema import Policy
from nvtrain.events import Event, EventLog
from nvtrain.events.records import EventsLogError, EventsLogResumed

__all__ = ["WorkerSettings", "load_settings", "say"]


def say(message: str) -> None:
    """One line on this worker's stderr (ft_launcher passes it to the pod's log), prefixed with
    the rank; a failing stderr is ignored (this only ever reports a problem)."""
    rank = os.environ.get("RANK", "0")
    with contextlib.suppress(OSError, ValueError):
        print(f"nvtrain worker rank {rank}: {message}", file=sys.stderr, flush=True)


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

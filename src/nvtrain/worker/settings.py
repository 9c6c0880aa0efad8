"""What a worker knows about its run: the resolved policy, run id, events log and its rank.

``nvtrain run`` passes these through the environment (``NVTRAIN_POLICY``, ``NVTRAIN_RUN_ID``,
``NVTRAIN_EVENTS``); ft_launcher adds the torchrun variables. A script started without nvtrain
(``python train.py``) gets a one-rank run with the built-in defaults, for debugging.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from nvtrain.config.schema import Policy
from nvtrain.events import EventLog

__all__ = ["WorkerSettings", "load_settings"]


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    policy: Policy
    run_id: str
    events_path: Path | None
    under_launcher: bool
    """True when an ft_launcher rank monitor is there to receive heartbeats."""

    def events(self, **common: object) -> EventLog | None:
        if self.events_path is None:
            return None
        return EventLog(self.events_path, run_id=self.run_id, source="worker", **common)


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
    )

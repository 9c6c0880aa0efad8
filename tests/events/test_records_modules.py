"""The records are defined by writer (``worker_events``, ``checkpoint_events``,
``launcher_events``, on ``base``) and imported from one place, ``nvtrain.events.records``."""

from __future__ import annotations

import importlib
import json

import pytest

from nvtrain.events import records
from nvtrain.events.base import EVENT_TYPES, Event, OtherEvent

DEFINING = (
    "nvtrain.events.worker_events",
    "nvtrain.events.checkpoint_events",
    "nvtrain.events.launcher_events",
)


def test_every_record_is_imported_from_records() -> None:
    for cls in (*EVENT_TYPES.values(), OtherEvent, Event):
        assert getattr(records, cls.__name__) is cls, cls.__name__
        assert cls.__name__ in records.__all__, f"records.__all__ lacks {cls.__name__}"


@pytest.mark.parametrize("name", DEFINING)
def test_each_defining_module_exports_exactly_its_records(name: str) -> None:
    module = importlib.import_module(name)
    defined = {
        attr
        for attr, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, Event) and value.__module__ == name
    }
    assert defined, name
    assert set(module.__all__) == defined
    assert defined <= set(records.__all__)


def test_records_of_every_writer_parse_back() -> None:
    """A record of each defining module reads back as itself through ``records.from_fields``
    (the registry is filled by every module, whichever is imported first)."""
    for name in ("step", "checkpoint_committed", "launcher_exit", "worker_failed", "dns_wait"):
        cls = EVENT_TYPES[name]
        line = json.loads(json.dumps({"ts": 1.0, "event": name, "v": 1, "rank": 2}))
        parsed = records.from_fields(line)
        assert type(parsed) is cls and parsed.rank == 2 and parsed.name == name
    legacy = records.from_fields({"ts": 1.0, "event": "worker_failed", "stopped": True, "exit_code": 1})
    assert isinstance(legacy, records.WorkerEnded) and legacy.reason == "stopped" and legacy.exit_code == 1

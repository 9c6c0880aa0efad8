"""The run's events log: typed records (``records``), the writer (``log``), the readers (``read``)."""

from nvtrain.events.log import EventLog, Reporter
from nvtrain.events.read import Events, EventTail, parse_event, read_events
from nvtrain.events.records import EVENT_TYPES, MAX_NUMBER, SCHEMA_VERSION, Event

__all__ = [
    "EVENT_TYPES",
    "MAX_NUMBER",
    "SCHEMA_VERSION",
    "Event",
    "EventLog",
    "EventTail",
    "Events",
    "Reporter",
    "parse_event",
    "read_events",
]

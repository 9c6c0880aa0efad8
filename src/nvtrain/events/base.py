"""The events' common part: the ``Event`` base record, the registry of record types
(``EVENT_TYPES``, filled by ``event_type``), the schema version, and how a field of each type is
read from a log line (``build``). The records themselves are in ``worker_events``,
``checkpoint_events`` and ``launcher_events``; ``records`` gathers them and parses a line.

Field types are checked once, at parse time: a number field holds a finite number within
``MAX_NUMBER`` or null, else the line is not an event; an integer field given a fraction reads
as None; a name field (a string) never holds a list or an object.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, TypeVar, dataclass_transform

__all__ = [
    "COMMON_FIELDS",
    "EVENT_TYPES",
    "MAX_NUMBER",
    "SCHEMA_VERSION",
    "Event",
    "OtherEvent",
    "build",
    "event_type",
]

SCHEMA_VERSION: Final = 1
"""Written as ``v`` in every event. 0 (no ``v``): logs of nvtrain before versioned events, which
carry the same fields."""

MAX_NUMBER: Final = 1e15
"""Largest magnitude of a number field: anything larger is no real value (a time, a duration,
a step, a rank), and sums of such numbers would overflow to infinity."""

COMMON_FIELDS: Final = ("host", "pid", "node", "run_id", "source", "rank")
"""The writer's fields, on every event (``Event``)."""

_INTERNED = 64
"""String values up to this length are interned (event names, hosts, run ids, layers)."""

E = TypeVar("E", bound="Event")


@dataclasses.dataclass(slots=True, kw_only=True)
class Event:
    """Fields every event has. ``ts``: seconds since the epoch (0 when built: ``EventLog.emit``
    stamps it); ``node``/``host``/``pid``/``run_id``/``source``: the writer's, added by its
    ``EventLog``; ``rank``: the global rank of the worker that wrote it, if a worker did.

    A record is a value: nothing changes it once built (``dataclasses.replace`` makes a changed
    copy). It is not a frozen dataclass only because those cost three times as much to build,
    and a report reads millions of them."""

    NAME: ClassVar[str] = ""
    LOGGED: ClassVar[bool] = True
    """False for what is only shown to the user (``Reporter``), never written to the log."""
    NULL_KEPT: ClassVar[frozenset[str]] = frozenset()
    """Own fields written even when null (null means something there); others are left out."""

    ts: float = 0.0
    host: str | None = None
    pid: int | None = None
    node: int | None = None
    run_id: str | None = None
    source: str | None = None
    rank: int | None = None
    v: int = 0
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Fields this version does not define, as read (JSON values)."""

    @property
    def name(self) -> str:
        return self.NAME

    @property
    def by_launcher(self) -> bool:
        return self.source == "launcher"

    @property
    def where(self) -> object:
        """The node that wrote it (its host name in logs without node numbers)."""
        return self.node if self.node is not None else self.host

    def fields(self) -> dict[str, Any]:
        """The record's own fields (not the common ones) that are set, as JSON values."""
        out = {}
        for attr, key in _OWN[type(self)]:
            value = getattr(self, attr)
            if value is not None or attr in self.NULL_KEPT:
                out[key] = list(value) if isinstance(value, tuple) else value
        return {**out, **self.extra}

    def as_dict(self) -> dict[str, Any]:
        """The event as the log holds it (``ts``, ``event``, ``v``, common and own fields)."""
        out: dict[str, Any] = {"ts": self.ts, "event": self.name, "v": self.v}
        for attr in COMMON_FIELDS:
            value = getattr(self, attr)
            if value is not None:
                out[attr] = value
        return {**out, **self.fields()}


@dataclass_transform(kw_only_default=True, field_specifiers=(dataclasses.field,))
def event_type(name: str, *, logged: bool = True) -> Callable[[type[E]], type[E]]:
    """Class decorator: a record named ``name`` in the log, registered for parsing
    (``EVENT_TYPES``, and how each of its fields is read)."""

    def register(cls: type[E]) -> type[E]:
        made = dataclasses.dataclass(slots=True, kw_only=True)(cls)
        made.NAME = name
        made.LOGGED = logged
        EVENT_TYPES[name] = made
        _spec(made)
        return made

    return register


EVENT_TYPES: dict[str, type[Event]] = {}
"""Every record type by its name in the log."""


_RESERVED = frozenset({"ts", "event", "v"})


class _Invalid(Exception):
    pass


def _int(value: object) -> int | None:
    if type(value) is int:
        if -MAX_NUMBER <= value <= MAX_NUMBER:
            return value
        raise _Invalid
    if value is None or (type(value) is float and -MAX_NUMBER <= value <= MAX_NUMBER):
        return None  # a fraction in an integer field carries nothing usable
    raise _Invalid  # a string, a bool, NaN, or out of range


def _float(value: object) -> float | None:
    if type(value) is float or type(value) is int:
        if -MAX_NUMBER <= value <= MAX_NUMBER:  # False for NaN
            return float(value)
        raise _Invalid
    if value is None:
        return None
    raise _Invalid


def _str(value: object) -> str | None:
    if type(value) is str:
        return sys.intern(value) if len(value) <= _INTERNED else value
    if value is None:
        return None
    if type(value) is list or type(value) is dict:
        raise _Invalid
    return str(value)


def _bool(value: object) -> bool | None:
    return value if type(value) is bool else None


def _strs(value: object) -> tuple[str, ...] | None:
    if type(value) is not list or any(type(v) is not str for v in value):
        return None
    return tuple(value)


def _ints(value: object) -> tuple[int, ...] | None:
    if type(value) is not list or any(type(v) is not int for v in value):
        return None
    return tuple(value)


_CONVERTERS: dict[str, Callable[[object], object]] = {
    "int | None": _int,
    "int": _int,
    "float | None": _float,
    "float": _float,
    "str | None": _str,
    "str": _str,
    "bool | None": _bool,
    "tuple[str, ...] | None": _strs,
    "tuple[int, ...] | None": _ints,
}
_OWN: dict[type[Event], tuple[tuple[str, str], ...]] = {}
"""Per record type: (attribute, key in the log) of its own fields."""
_SPEC: dict[type[Event], dict[str, tuple[str, Callable[[object], object]]]] = {}
"""Per record type: key in the log -> (attribute, converter), common fields included."""


def _spec(cls: type[Event]) -> None:
    own, spec = [], {}
    for f in dataclasses.fields(cls):
        if f.name in ("extra", "v", "ts") or (cls is OtherEvent and f.name == "event"):
            continue
        convert = _CONVERTERS.get(str(f.type))
        if convert is None:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported field type {f.type}")
        key = f.metadata.get("key", f.name)
        spec[key] = (f.name, convert)
        if f.name not in _BASE:
            own.append((f.name, key))
    _OWN[cls] = tuple(own)
    _SPEC[cls] = spec


_BASE = {f.name for f in dataclasses.fields(Event)}


@dataclasses.dataclass(slots=True, kw_only=True)
class OtherEvent(Event):
    """An event this version does not define (a newer writer's): its fields are in ``extra``."""

    event: str = ""

    @property
    def name(self) -> str:
        return self.event


for _cls in (OtherEvent, Event):
    _spec(_cls)


def build(cls: type[Event], name: str, stamp: float, record: Mapping[str, Any]) -> Event | None:
    """A ``cls`` record of one JSON object from a log (its ``event`` is ``name``, its ``ts``
    ``stamp``); None when a field has the wrong type (see the module's doc)."""
    spec = _SPEC[cls]
    version = record.get("v")
    values: dict[str, Any] = {"ts": stamp, "v": version if type(version) is int else 0}
    extra: dict[str, Any] = {}
    try:
        for key, value in record.items():
            known = spec.get(key)
            if known is not None:
                values[known[0]] = known[1](value)
            elif key not in _RESERVED:
                extra[sys.intern(key)] = value
    except _Invalid:
        return None
    if cls is OtherEvent:
        values["event"] = sys.intern(name)
    if extra:
        values["extra"] = extra
    return cls(**values)

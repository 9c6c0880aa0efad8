"""Defaults that follow the keys a policy sets: a default never contradicts an explicit value.

``derive_defaults`` runs on the raw policy data (the parsed TOML) before the model validates
it. Each key below that the file leaves unset gets a value computed from the keys it does set,
so that a minimal policy such as ``[heartbeat] timeout = "30s"`` is valid as written; the
validated model still holds plain seconds. A key the file sets is never changed. When no value
of an unset key satisfies the keys it depends on, the plain default stays and the checks report
the conflict (naming the key as derived).

``docs/policy.md`` ("Derived defaults") lists the rules; each field's docstring repeats its own.

``backend = "auto"`` becomes NCCL or gloo only where the workers run (gloo without CUDA), which
``nvtrain validate`` cannot know: it takes ``"auto"`` for NCCL unless ``nproc_per_node = "cpu"``.
A worker passes the backend it resolved (``backend=``), so that a collective timeout the file
leaves unset follows the gloo rule on a machine without a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, TypeGuard

from pydantic import BaseModel

from nvtrain.config.duration import parse_duration
from nvtrain.config.timeouts import (
    COLLECTIVE,
    COLLECTIVE_TIMEOUT,
    GLOO_COLLECTIVE_FRACTION,
    HARD,
    HARD_OVER_SOFT,
    HARD_TIMEOUT,
    MARGIN,
    NCCL_COLLECTIVE_FACTOR,
    SOFT,
    SOFT_TIMEOUT,
    key_name,
    lower_bounds,
    upper_bounds,
)

__all__ = [
    "CHECKPOINT_INTERVAL",
    "COLLECTIVE_TIMEOUT",
    "DERIVED_KEYS",
    "ESCALATE_AFTER",
    "HARD_TIMEOUT",
    "MAX_DURATION",
    "METRICS_PORT",
    "MONITOR_INTERVAL",
    "RENDEZVOUS_PORT",
    "SOFT_TIMEOUT",
    "Backend",
    "derive_defaults",
    "gloo_collective_timeout",
]

MAX_DURATION = 365 * 86400.0
"""Longest duration of any policy key (a year), far below what timers and int64 grace periods hold."""

MONITOR_INTERVAL = 5.0
CHECKPOINT_INTERVAL = 1000
ESCALATE_AFTER = 3
RENDEZVOUS_PORT = 29500
METRICS_PORT = 9464

DERIVED_KEYS = frozenset(
    {
        "heartbeat.monitor_interval",
        "restart.in_process.hard_timeout",
        "restart.in_process.soft_timeout",
        "job.collective_timeout",
        "metrics.port",
        "rendezvous.port",
        "rendezvous.nodes",
        "checkpoint.interval",
        "restart.escalate_after",
    }
)
"""Every key whose default may be derived (``"table.key"``); ``Policy.derived`` names those that were."""

Backend = Literal["nccl", "gloo"]
"""A backend as the workers use it: what ``"auto"`` resolves to."""

_Path = tuple[str, ...]


class _Draft:
    """The raw data, read by dotted path, with the derived keys written into a copy."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.derived: dict[str, str] = {}

    def _node(self, table: _Path) -> dict[str, Any] | BaseModel | None:
        """The table at ``table`` (``{}`` when absent); None when a value there is no table."""
        node: Any = self.data
        for part in table:
            if isinstance(node, dict):
                node = node.get(part, {})
            elif isinstance(node, BaseModel):
                node = getattr(node, part) if part in node.model_fields_set else {}
            else:
                return None
        return node if isinstance(node, dict | BaseModel) else None

    def given(self, path: _Path) -> bool:
        """Whether the file sets ``path`` (or its table is not a table: nothing is derived)."""
        node = self._node(path[:-1])
        if isinstance(node, BaseModel):
            return path[-1] in node.model_fields_set
        return node is None or path[-1] in node

    def value(self, path: _Path) -> Any:
        node = self._node(path[:-1])
        if isinstance(node, BaseModel):
            return getattr(node, path[-1]) if path[-1] in node.model_fields_set else None
        return None if node is None else node.get(path[-1])

    def seconds(self, path: _Path) -> float | None:
        """The duration the file sets at ``path``; None when unset or not a valid duration
        (longer than ``MAX_DURATION`` included: nothing follows a value reported as an error)."""
        if not self.given(path):
            return None
        try:
            seconds = parse_duration(self.value(path))
        except ValueError:
            return None
        return seconds if seconds <= MAX_DURATION else None

    def put(self, path: _Path, value: object, follows: str | None) -> None:
        """Set the unset key ``path`` to ``value`` (copying the tables on the way), as derived
        from what it ``follows`` (None: written out with the value it has anyway)."""
        assert not self.given(path) and ".".join(path) in DERIVED_KEYS
        self.data = _with(self.data, path, value)
        if follows is not None:
            self.derived[".".join(path)] = follows


def _with(node: Any, path: _Path, value: object) -> dict[str, Any]:
    """A copy of table ``node`` with ``path`` set to ``value``."""
    if isinstance(node, BaseModel):
        table = {name: getattr(node, name) for name in node.model_fields_set}
    else:
        table = dict(node) if isinstance(node, dict) else {}
    table[path[0]] = value if len(path) == 1 else _with(table.get(path[0]), path[1:], value)
    return table


def _round(seconds: float, above: float | None = None) -> float:
    """``seconds`` without float noise (milliseconds), still above ``above``."""
    rounded = math.floor(seconds * 1000) / 1000
    return seconds if rounded <= 0 or (above is not None and rounded <= above) else rounded


def _between(preferred: float, lo: float | None, hi: float | None) -> float:
    """``preferred`` if it lies strictly between ``lo`` and ``hi`` (either may be absent), else
    their midpoint; ``preferred`` when no value fits (the checks report that conflict)."""
    if (lo is None or preferred > lo) and (hi is None or preferred < hi):
        return preferred
    if lo is not None and hi is not None and lo < hi:
        return _round((lo + hi) / 2, lo)
    return preferred


def derive_defaults(data: Any, *, backend: Backend | None = None) -> tuple[Any, dict[str, str]]:
    """``data`` with the derived defaults filled in, and ``{"table.key": what it follows}``
    for each key derived. ``data`` itself is not changed; anything but a table is returned
    as it is (the model reports it).

    ``backend``: what ``backend = "auto"`` resolves to on the workers' machine (None: as
    ``nvtrain validate`` sees it, gloo with ``nproc_per_node = "cpu"`` and NCCL otherwise). It
    decides only the collective timeout, when the data leaves that unset (``_in_process``)."""
    if not isinstance(data, dict):
        return data, {}
    d = _Draft(data)
    _heartbeat(d)
    _in_process(d, backend)
    _ports(d)
    _sizes(d)
    return d.data, d.derived


def _heartbeat(d: _Draft) -> None:
    """``monitor_interval``: at most a fifth of every fixed timeout the monitor enforces
    (``"auto"`` ones have no value yet)."""
    path = ("heartbeat", "monitor_interval")
    if d.given(path):
        return
    limits: list[tuple[float, str]] = []
    for key in ("timeout", "initial_timeout", "out_of_section_timeout"):
        seconds = d.seconds(("heartbeat", key))
        if seconds is not None:
            limits.append((seconds, key))
    sections = d.value(("heartbeat", "sections"))
    if isinstance(sections, dict):
        for name, value in sections.items():
            try:
                limits.append((parse_duration(value), f"sections.{name}"))
            except ValueError:
                continue
    if not limits:
        return
    shortest, key = min(limits)
    if shortest / 5 < MONITOR_INTERVAL:
        d.put(path, _round(shortest / 5), f"a fifth of [heartbeat] {key}")


def _backend(d: _Draft, resolved: Backend | None = None) -> str:
    """The backend the workers will use: ``resolved`` for ``auto`` when given, else as the
    checks see it (``auto`` on CPU jobs is gloo)."""
    backend = d.value(("job", "backend")) if d.given(("job", "backend")) else "auto"
    if backend == "auto":
        if resolved is not None:
            return resolved
        return "gloo" if d.value(("job", "nproc_per_node")) == "cpu" else "nccl"
    return str(backend)


def _in_process(d: _Draft, resolved: Backend | None) -> None:
    """``[restart.in_process]`` soft and hard timeouts, and ``[job] collective_timeout``.

    The order kept is ``timeouts.ORDER``'s: failure_window < soft_timeout < hard_timeout <
    [heartbeat] timeout; with NCCL hard_timeout < collective_timeout, with gloo
    collective_timeout < soft_timeout. What bounds the soft timeout from below and the hard one
    from above is read from that table."""
    table = ("restart", "in_process")
    if d.given((*table, "enabled")) and d.value((*table, "enabled")) is False:
        return
    # What "auto" resolved to counts only where it differs from validate's view, and only for a
    # collective timeout left unset: the backend then bounds neither the soft nor the hard
    # timeout (it does so through a collective timeout that is set), so the workers keep those
    # `nvtrain validate` showed. All three are written out, so that validating the result under
    # validate's view derives nothing more. An explicit collective timeout stays as written
    # (validate warns when it breaks the gloo rule: checks_backend.py).
    resolving = (
        resolved is not None and _backend(d) != _backend(d, resolved) and not d.given(_path(COLLECTIVE))
    )
    backend = "gloo" if _backend(d, resolved if resolving else None) == "gloo" else "nccl"
    # What the soft timeout must exceed (and so the hard one too), and what the hard one must not reach.
    floor = _bound(max, *((d.seconds(_path(key)), key_name(key)) for key in lower_bounds(SOFT, backend)))
    ceiling = _bound(min, *((d.seconds(_path(key)), key_name(key)) for key in upper_bounds(HARD, backend)))
    hard = _hard(d, floor, ceiling, resolving)
    if hard is None:
        return  # an invalid hard_timeout: its own finding says so
    soft = _soft(d, floor, hard, resolving)
    if soft is None:
        return
    _collective(d, backend == "gloo", soft, hard, resolving)


def _path(key: str) -> _Path:
    return tuple(key.split("."))


def _hard(d: _Draft, floor: _Bound | None, ceiling: _Bound | None, resolving: bool) -> float | None:
    """The hard timeout: derived when unset (above the soft timeout, or the floor, below the
    ceiling); None when the file sets an invalid one."""
    hard_path, soft = _path(HARD), d.seconds(_path(SOFT))
    if not d.given(hard_path):
        lo = (soft, "soft_timeout") if soft is not None else floor
        unbounded = HARD_TIMEOUT if lo is None else max(HARD_TIMEOUT, _round(HARD_OVER_SOFT * lo[0], lo[0]))
        preferred = unbounded if ceiling is None else min(unbounded, _round(MARGIN * ceiling[0]))
        value = _between(preferred, lo and lo[0], ceiling and ceiling[0])
        if lo is not None and value <= lo[0]:  # no value fits: the default as if nothing bounded it above
            value = unbounded
        if value > MAX_DURATION and (lo is None or lo[0] < MAX_DURATION):
            value = MAX_DURATION
        fits = (lo is None or value > lo[0]) and (ceiling is None or value < ceiling[0])
        if value != HARD_TIMEOUT or not fits:
            d.put(hard_path, value, _follows(lo, ceiling))
    hard = d.seconds(hard_path) if d.given(hard_path) else HARD_TIMEOUT
    if hard is not None and resolving and not d.given(hard_path):
        d.put(hard_path, HARD_TIMEOUT, None)
    return hard


def _soft(d: _Draft, floor: _Bound | None, hard: float, resolving: bool) -> float | None:
    """The soft timeout: derived when unset (above the floor, below ``hard``); None when the
    file sets an invalid one."""
    soft_path = _path(SOFT)
    if not d.given(soft_path):
        preferred = min(SOFT_TIMEOUT, _round(MARGIN * hard))
        value = _between(preferred, floor and floor[0], hard)
        if value != SOFT_TIMEOUT or not (floor is None or value > floor[0]) or value >= hard:
            d.put(soft_path, value, _follows(floor, (hard, "hard_timeout")))
    soft = d.seconds(soft_path) if d.given(soft_path) else SOFT_TIMEOUT
    if soft is not None and resolving and not d.given(soft_path):
        d.put(soft_path, SOFT_TIMEOUT, None)
    return soft


def _collective(d: _Draft, gloo: bool, soft: float, hard: float, resolving: bool) -> None:
    """The collective timeout, when unset: below the soft timeout with gloo (a gloo collective
    cannot be aborted: its timeout frees the surviving ranks), above the hard one with NCCL."""
    collective_path = _path(COLLECTIVE)
    if d.given(collective_path):
        return
    if gloo:
        value = gloo_collective_timeout(soft)
        follows = "[restart.in_process] soft_timeout (with gloo)"
    else:
        value = max(COLLECTIVE_TIMEOUT, NCCL_COLLECTIVE_FACTOR * hard)
        if value > MAX_DURATION > hard:
            value = MAX_DURATION
        follows = "[restart.in_process] hard_timeout"
    if value != COLLECTIVE_TIMEOUT:
        d.put(collective_path, value, follows)
    elif resolving:
        d.put(collective_path, value, None)


def gloo_collective_timeout(soft_timeout: float) -> float:
    """The collective timeout derived with gloo: three quarters of the in-process soft timeout
    (at most the plain default), so that it frees the surviving ranks before the soft timeout."""
    return min(COLLECTIVE_TIMEOUT, _round(GLOO_COLLECTIVE_FRACTION * soft_timeout))


_Bound = tuple[float, str]


def _bound(pick: Callable[[list[_Bound]], _Bound], *candidates: tuple[float | None, str]) -> _Bound | None:
    """The tightest of the ``candidates`` that are set (``pick`` is ``max`` or ``min``)."""
    given = [(value, key) for value, key in candidates if value is not None]
    return pick(given) if given else None


def _follows(*bounds: _Bound | None) -> str:
    return " and ".join(bound[1] for bound in bounds if bound is not None)


def _ports(d: _Draft) -> None:
    """``[metrics] port`` and ``[rendezvous] port`` differ."""
    rendezvous = d.value(("rendezvous", "port")) if d.given(("rendezvous", "port")) else RENDEZVOUS_PORT
    metrics = d.value(("metrics", "port")) if d.given(("metrics", "port")) else METRICS_PORT
    if rendezvous != metrics:
        return
    if not d.given(("metrics", "port")):
        d.put(("metrics", "port"), METRICS_PORT + 1, "[rendezvous] port")
    elif not d.given(("rendezvous", "port")):
        d.put(("rendezvous", "port"), RENDEZVOUS_PORT + 1, "[metrics] port")


def _sizes(d: _Draft) -> None:
    """``[rendezvous] nodes`` from ``min_nodes``, ``[checkpoint] interval`` from ``[job]
    max_steps`` and ``[restart] escalate_after`` from the in-job budget."""
    min_nodes = d.value(("rendezvous", "min_nodes"))
    if not d.given(("rendezvous", "nodes")) and _count(min_nodes) and min_nodes > 1:
        d.put(("rendezvous", "nodes"), min_nodes, "[rendezvous] min_nodes")
    steps = d.value(("job", "max_steps"))
    if not d.given(("checkpoint", "interval")) and _count(steps) and steps // 10 < CHECKPOINT_INTERVAL:
        d.put(("checkpoint", "interval"), max(1, steps // 10), "[job] max_steps")
    restarts = d.value(("restart", "in_job", "max_restarts"))
    in_process_off = (
        d.given(("restart", "in_process", "enabled"))
        and d.value(("restart", "in_process", "enabled")) is False
    )
    if (
        not d.given(("restart", "escalate_after"))
        and in_process_off
        and _count(restarts)
        and 0 < restarts < ESCALATE_AFTER - 1
    ):
        d.put(("restart", "escalate_after"), restarts + 1, "[restart.in_job] max_restarts")


def _count(value: object) -> TypeGuard[int]:
    """A whole number (not a bool) >= 1, as the keys read here must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1

"""The order of the recovery layers' timeouts, in one table read by derivation, checks and worker.

Each layer must get its chance to act before the one above it takes over::

    failure_window < soft_timeout < hard_timeout < [heartbeat] timeout <= [heartbeat] initial_timeout
    with NCCL: hard_timeout < collective_timeout    (NVRx aborts a hung NCCL collective itself)
    with gloo: collective_timeout < hard_timeout, and < soft_timeout with more than one rank
               (a gloo collective cannot be aborted: its timeout frees the surviving ranks)

``ORDER`` holds these rules as data, one ``Order`` a rule, in the order ``nvtrain validate``
reports them. ``checks_timeouts.py`` turns a broken rule into its finding, ``derive.py`` reads
from the table what bounds the soft and hard timeouts it derives, ``reference.py`` writes the
diagram of ``docs/policy.md`` ("Heartbeats and timeouts") from it, and the worker's NVRx
arguments (``wrapper_plan.py``) take the timeouts that follow from the order (``barrier``,
``settle_time``) from here.

This module imports nothing of nvtrain but the duration format: the worker and the CLI read it
without the policy model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Literal

from nvtrain.config.duration import format_duration

__all__ = [
    "COLLECTIVE",
    "COLLECTIVE_TIMEOUT",
    "GLOO_COLLECTIVE_FRACTION",
    "HARD",
    "HARD_OVER_SOFT",
    "HARD_TIMEOUT",
    "HEARTBEAT",
    "INITIAL",
    "MARGIN",
    "NCCL_COLLECTIVE_FACTOR",
    "ORDER",
    "SLOW_FAILURE_WINDOW",
    "SOFT",
    "SOFT_TIMEOUT",
    "WINDOW",
    "Key",
    "Order",
    "barrier",
    "diagram",
    "key_name",
    "lower_bounds",
    "settle_time",
    "upper_bounds",
]

SOFT_TIMEOUT = 60.0
"""``[restart.in_process] soft_timeout`` when nothing bounds it."""
HARD_TIMEOUT = 90.0
"""``[restart.in_process] hard_timeout`` when nothing bounds it."""
COLLECTIVE_TIMEOUT = 600.0
"""``[job] collective_timeout`` when nothing bounds it."""

MARGIN = 2 / 3
"""A derived timeout that must stay below another one takes at most this fraction of it."""
HARD_OVER_SOFT = 1.5
"""A derived hard timeout is at least this multiple of what it must exceed."""
GLOO_COLLECTIVE_FRACTION = 0.75
"""A derived gloo collective timeout is this fraction of the soft timeout."""
NCCL_COLLECTIVE_FACTOR = 2.0
"""A derived NCCL collective timeout is at least this multiple of the hard timeout."""
SLOW_FAILURE_WINDOW = 5.0
"""A ``failure_window`` above this (seconds) is warned about: every soft fault waits it out."""

# The keys of the order, as "table.key".
SOFT = "restart.in_process.soft_timeout"
HARD = "restart.in_process.hard_timeout"
WINDOW = "restart.in_process.failure_window"
COLLECTIVE = "job.collective_timeout"
HEARTBEAT = "heartbeat.timeout"
INITIAL = "heartbeat.initial_timeout"

Key = str
"""A policy key as ``"table.key"`` (``"restart.in_process.soft_timeout"``)."""


@dataclasses.dataclass(frozen=True)
class Order:
    """``lower < upper`` (``lower <= upper`` unless ``strict``), where it ``applies``.

    ``upper`` is a key or a fixed number of seconds. A rule involving a key the policy leaves
    unset does not apply. A broken rule is a finding on ``subject`` (``lower`` or ``upper``),
    its ``rule`` and ``fix`` written with ``{lower}``, ``{upper}`` (durations) and ``{example}``
    (``upper`` x ``example``)."""

    name: str
    lower: Key
    upper: Key | float
    severity: Literal["error", "warning"]
    code: str
    subject: Literal["lower", "upper"]
    rule: str
    fix: str
    strict: bool = True
    in_process: bool = True
    """Applies only with in-process restart on."""
    backend: Literal["nccl", "gloo"] | None = None
    """Applies only with this backend (``"auto"`` as ``nvtrain validate`` sees it)."""
    ranks: bool = False
    """Applies only with more than one rank (or a rank count not known before the node)."""
    unless: str | None = None
    """Not reported when the rule of this name is broken (that one says enough)."""
    example: tuple[int, int] | None = None
    """``{example}`` in ``fix``: ``upper`` times this fraction (numerator, denominator)."""

    def holds(self, lower: float, upper: float) -> bool:
        return lower < upper if self.strict else lower <= upper

    def text(self, template: str, lower: float, upper: float) -> str:
        example = upper if self.example is None else upper * self.example[0] / self.example[1]
        return template.format(
            lower=format_duration(lower), upper=format_duration(upper), example=format_duration(example)
        )


ORDER: tuple[Order, ...] = (
    Order(
        name="initial_timeout >= timeout",
        lower=HEARTBEAT,
        upper=INITIAL,
        severity="error",
        code="heartbeat-order",
        subject="upper",
        rule="must be >= timeout ({lower}): the first heartbeat also waits for "
        "start-up and the checkpoint load",
        fix='raise it to at least "{lower}"',
        strict=False,
        in_process=False,
    ),
    Order(
        name="soft_timeout < hard_timeout",
        lower=SOFT,
        upper=HARD,
        severity="error",
        code="timeout-order",
        subject="lower",
        rule="must be shorter than hard_timeout ({upper})",
        fix='lower soft_timeout below "{upper}" or raise hard_timeout',
    ),
    Order(
        name="hard_timeout < [heartbeat] timeout",
        lower=HARD,
        upper=HEARTBEAT,
        severity="error",
        code="timeout-order",
        subject="lower",
        rule="must be shorter than [heartbeat] timeout ({upper}), "
        "or ft_launcher restarts the workers before the in-process layer acts",
        fix='lower hard_timeout below "{upper}" or raise the heartbeat timeout',
    ),
    Order(
        name="failure_window < soft_timeout",
        lower=WINDOW,
        upper=SOFT,
        severity="error",
        code="timeout-order",
        subject="lower",
        rule="must be shorter than soft_timeout ({upper}): every soft fault waits "
        "this long before it is handled",
        fix='use a fraction of a second, e.g. "100ms"',
    ),
    Order(
        name="failure_window <= 5s",
        lower=WINDOW,
        upper=SLOW_FAILURE_WINDOW,
        severity="warning",
        code="slow-recovery",
        subject="lower",
        rule="every in-process restart waits this long before it starts; ranks that fail together "
        "report within a fraction of a second of each other",
        fix='use "100ms" unless measured failures of one fault are spread wider',
        strict=False,
        unless="failure_window < soft_timeout",
    ),
    Order(
        name="collective_timeout < soft_timeout (gloo)",
        lower=COLLECTIVE,
        upper=SOFT,
        severity="error",
        code="timeout-order",
        subject="lower",
        rule="must be shorter than [restart.in_process] soft_timeout ({upper}) "
        "with gloo: a rank blocked in a gloo collective with a failed peer returns only at "
        "this timeout, and NVRx re-raises its restart into a rank that has not returned "
        "one soft timeout after the fault, which can end that rank instead of restarting it",
        fix='lower it below "{upper}", e.g. "{example}"',
        backend="gloo",
        ranks=True,
        unless="collective_timeout < hard_timeout (gloo)",
        example=(3, 4),
    ),
    Order(
        name="collective_timeout < hard_timeout (gloo)",
        lower=COLLECTIVE,
        upper=HARD,
        severity="error",
        code="timeout-order",
        subject="lower",
        rule="must be shorter than [restart.in_process] hard_timeout "
        "({upper}) with gloo: gloo collectives cannot be aborted, so "
        "surviving ranks stay blocked until this timeout and are killed first",
        fix='lower it below "{upper}", e.g. "{example}"',
        backend="gloo",
        example=(2, 3),
    ),
    Order(
        name="hard_timeout < collective_timeout (NCCL)",
        lower=HARD,
        upper=COLLECTIVE,
        severity="error",
        code="timeout-order",
        subject="upper",
        rule="must be longer than [restart.in_process] hard_timeout ({lower}) "
        "with NCCL, or the collective timeout ends the process before the in-process "
        "layer can restart it",
        fix='raise it above "{lower}", or set backend = "gloo" for CPU jobs',
        backend="nccl",
    ),
)
"""The rules of the order, in the order their findings are reported."""


def key_name(key: Key, within: str = "restart.in_process") -> str:
    """``key`` as the findings and derived-default notes name it: bare within the table
    ``within``, else ``[table] key``."""
    table, _, name = key.rpartition(".")
    return name if table == within else f"[{table}] {name}"


def _rules(backend: str) -> Iterator[Order]:
    """The in-process rules of key against key that hold with ``backend``."""
    for order in ORDER:
        if order.in_process and isinstance(order.upper, str) and order.backend in (None, backend):
            yield order


def lower_bounds(key: Key, backend: str) -> list[Key]:
    """The keys that must stay below ``key`` with ``backend`` (``derive.py``'s floor of the
    soft timeout: ``failure_window``, and the collective timeout with gloo)."""
    return [order.lower for order in _rules(backend) if order.upper == key]


def upper_bounds(key: Key, backend: str) -> list[Key]:
    """The keys that ``key`` must stay below with ``backend`` (``derive.py``'s ceiling of the
    hard timeout: the heartbeat timeout, and the collective timeout with NCCL)."""
    return [str(order.upper) for order in _rules(backend) if order.lower == key]


def barrier(soft: float, hard: float) -> float:
    """Seconds the worker's NVRx barriers, completion and store requests may wait: past the
    hard timeout (a hung rank is killed by then) by the soft timeout, at least 30 s."""
    return hard + max(30.0, soft)


def settle_time(soft: float, hard: float) -> float:
    """How long a soft fault waits for the checkpoint in flight: half the time between the soft
    and the hard timeout, so a hang detected at the soft timeout is restarted before the hard one."""
    return max(0.0, (hard - soft) / 2)


def _short(key: Key | float) -> str:
    if isinstance(key, float):
        return format_duration(key)
    table, _, name = key.rpartition(".")
    return f"[{table}] {name}" if table == "heartbeat" else name


def diagram() -> str:
    """The order as ``docs/policy.md`` shows it, one rule a line (``reference.update_docs``)."""
    lines = []
    for order in ORDER:
        sign = "<" if order.strict else "<="
        where = ["in-process restart on"] if order.in_process else []
        if order.backend == "nccl":
            where.append('with NCCL ("nccl", and "auto" as validated)')
        elif order.backend == "gloo":
            where.append("with gloo" + (" and more than one rank" if order.ranks else ""))
        if order.severity == "warning":
            where.append(f"a warning ({order.code}), not an error")
        line = f"{_short(order.lower)}  {sign}  {_short(order.upper)}"
        lines.append(f"{line:<54}{', '.join(where)}".rstrip())
    return "\n".join(lines) + "\n"

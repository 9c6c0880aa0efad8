"""The checkpoint-interval model of ``nvtrain tune-interval``: pure math, no I/O.

Notation (seconds unless said otherwise): ``t`` step time; ``δ`` time training is blocked per
save (the staging copy when saves are async, the whole save when sync); ``W`` background write
after staging (async only); ``M`` the job's mean time between failures; ``R`` time from a
failure to training again (restart plus checkpoint load); ``τ`` compute time between two saves.

* Young (1974): ``τ = √(2δM)``.
* Daly (2006): ``τ = √(2δM)·[1 + ⅓·√(δ/2M) + (δ/2M)/9] − δ`` for ``δ < 2M``, else ``τ = M``.
* Async floor: a save waits for the previous write, so ``k·t >= W·margin`` (and ``>= W``'s p95).
* Write spread: ``W`` is lognormal with its median and p95; a save waits ``E[max(0, W − τ)]``
  on average, which is added to ``δ``.
* Expected efficiency (Daly's complete model, with the async write lag added to the time lost
  per failure): ``τ / (M·e^((R + lag)/M)·(e^((τ + δ)/M) − 1))``, where ``lag`` is the mean
  write when async, 0 when sync. Its first-order expansion is the usual waste
  ``δ/(τ + δ) + ((τ + δ)/2 + lag + R)/M``.

``docs/tune-interval.md`` explains the model, its assumptions and a worked example.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Literal

__all__ = [
    "DEFAULT_WRITE_MARGIN",
    "Binding",
    "Inputs",
    "Mode",
    "Outcome",
    "Recommendation",
    "Report",
    "Waste",
    "daly",
    "efficiency",
    "evaluate",
    "nice_at_least",
    "nice_at_most",
    "percent",
    "recommend",
    "short_duration",
    "tune",
    "young",
]

Mode = Literal["async", "sync"]
Binding = Literal["failures", "write", "step"]
"""What sets the recommended interval: the balance of save blocking against rework after
failures (Daly), the async write-time floor, or one step (the optimum is shorter than a step)."""

DEFAULT_WRITE_MARGIN = 1.5
"""The time between two async saves must exceed the median background write by this factor (the
fix ``nvtrain validate`` suggests for its ``write-bound`` warning uses the same factor)."""

_DAY = 86400.0
_EXP_LIMIT = 700.0  # math.exp overflows a little above 709
_KEEP_WITHIN = 0.001  # efficiency gains below 0.1 percentage points are not worth a change
_Z95 = 1.6448536269514722  # the standard normal's 95th percentile
_MAX_SIGMA = 2.0  # a write p95 above ~27x its median is treated as 27x (the mean would explode)
_NICE = (10, 12, 15, 20, 25, 30, 40, 50, 60, 80)


def young(delta: float, mtbf: float) -> float:
    """Young's first-order optimum compute time between saves: ``√(2·δ·M)``."""
    _positive(delta=delta, mtbf=mtbf)
    return math.sqrt(2.0 * delta * mtbf)


def daly(delta: float, mtbf: float) -> float:
    """Daly's higher-order estimate of the optimum compute time between saves.

    ``√(2δM)·[1 + ⅓·√(δ/(2M)) + (1/9)·(δ/(2M))] − δ`` when ``δ < 2M``; ``M`` otherwise.
    """
    _positive(delta=delta, mtbf=mtbf)
    if delta >= 2.0 * mtbf:
        return mtbf
    ratio = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - delta


def efficiency(tau: float, delta: float, mtbf: float, lost_per_failure: float) -> float:
    """Expected share of wall time spent on useful steps, in [0, 1].

    Daly's complete model with exponentially distributed failures: a segment of ``tau`` compute
    plus ``delta`` blocked takes ``M·e^(L/M)·(e^((τ+δ)/M) − 1)`` of wall time on average, where
    ``L`` is the time lost per failure besides the rework of the segment itself (restart, load,
    and the async write lag).
    """
    _positive(tau=tau, mtbf=mtbf)
    _not_negative(delta=delta, lost_per_failure=lost_per_failure)
    x = (tau + delta) / mtbf
    y = lost_per_failure / mtbf
    if x + y > _EXP_LIMIT:
        return 0.0
    wall = mtbf * math.exp(y) * math.expm1(x)
    return min(1.0, max(0.0, tau / wall))


def _nice_numbers() -> Iterator[int]:
    yield from range(1, 10)
    scale = 1
    while True:
        for m in _NICE:
            yield m * scale
        scale *= 10


def nice_at_least(value: float) -> int:
    """The smallest "nice" step count >= ``value``: 1-9, then 10, 12, 15, 20, 25, 30, 40, 50,
    60, 80 times a power of ten (neighbours differ by at most a third)."""
    if not math.isfinite(value):
        raise ValueError(f"no step count is at least {value}")
    return next(n for n in _nice_numbers() if n >= value - 1e-9)


def nice_at_most(value: float) -> int:
    """The largest "nice" step count <= ``value``; 1 when ``value`` is below 1."""
    if not math.isfinite(value):
        raise ValueError(f"no step count is at most {value}")
    best = 1
    for n in _nice_numbers():
        if n > value + 1e-9:
            return best
        best = n
    raise AssertionError("unreachable")  # pragma: no cover


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Inputs:
    """What the model needs, in seconds. ``save_write_s`` may be None only for sync saves."""

    step_s: float
    """Compute time of one training step."""
    save_block_s: float
    """Time training is blocked per save when async (staging)."""
    save_write_s: float | None
    """Median background write after staging; a sync save blocks for staging plus this."""
    mtbf_s: float
    """The job's mean time between failures that interrupt it."""
    restart_s: float = 0.0
    """Failure to training again, not counting the checkpoint load."""
    restore_s: float = 0.0
    """Loading the newest checkpoint."""
    save_write_p95_s: float | None = None
    """95th percentile of the background write, when measured."""
    write_margin: float = DEFAULT_WRITE_MARGIN
    """The async floor: time between saves >= this times the median write."""

    def __post_init__(self) -> None:
        _positive(step_s=self.step_s, save_block_s=self.save_block_s, mtbf_s=self.mtbf_s)
        _not_negative(restart_s=self.restart_s, restore_s=self.restore_s)
        if self.save_write_s is not None:
            _not_negative(save_write_s=self.save_write_s)
        if self.save_write_p95_s is not None:
            _not_negative(save_write_p95_s=self.save_write_p95_s)
        if not (math.isfinite(self.write_margin) and self.write_margin >= 1.0):
            raise ValueError(f"write_margin must be >= 1 (got {self.write_margin})")

    @property
    def recovery_s(self) -> float:
        """Failure to training again, checkpoint load included."""
        return self.restart_s + self.restore_s

    def can_evaluate(self, mode: Mode) -> bool:
        return mode == "sync" or self.save_write_s is not None

    def blocking_s(self, mode: Mode) -> float:
        """δ: blocked per save when the previous write never makes a save wait."""
        if mode == "sync":
            return self.save_block_s + (self.save_write_s or 0.0)
        return self.save_block_s

    def lag_s(self, mode: Mode) -> float:
        """How long after staging a checkpoint becomes durable (restorable)."""
        return self.mean_write_s() if mode == "async" else 0.0

    def write_p95_s(self) -> float:
        """The write's 95th percentile: measured, else assumed ``write_margin`` × the median."""
        write = self.write_s("async")
        if self.save_write_p95_s is not None:
            return max(self.save_write_p95_s, write)
        return write * self.write_margin

    def write_need_s(self) -> float:
        """Async: the least time between two saves that hides the background write."""
        return max(self.write_s("async") * self.write_margin, self.write_p95_s())

    def expected_wait_s(self, tau: float) -> float:
        """Async: expected wait of a save for the previous write when saves are ``tau`` apart.

        The write time is taken as lognormal with the median and p95 above (a fixed time when
        they are equal): the wait is ``E[max(0, W - τ)]``.
        """
        median = self.write_s("async")
        sigma = _sigma(median, self.write_p95_s())
        if sigma == 0.0 or tau <= 0.0:
            return max(0.0, median * math.exp(sigma * sigma / 2.0) - tau)
        d2 = (math.log(median) - math.log(tau)) / sigma
        d1 = d2 + sigma
        wait = median * math.exp(sigma * sigma / 2.0) * _phi(d1) - tau * _phi(d2)
        return max(0.0, wait)

    def mean_write_s(self) -> float:
        """Async: the expected background write (the lognormal's mean)."""
        median = self.write_s("async")
        sigma = _sigma(median, self.write_p95_s())
        return median * math.exp(sigma * sigma / 2.0)

    def floor_steps(self, mode: Mode) -> int:
        """The fewest steps between two saves: 1 when sync; the write floor when async."""
        if mode == "sync":
            return 1
        return max(1, math.ceil(self.write_need_s() / self.step_s - 1e-9))

    def write_s(self, mode: Mode) -> float:
        if self.save_write_s is None:
            raise ValueError(f"{mode} saves need the background write time (save_write_s)")
        return self.save_write_s


@dataclasses.dataclass(frozen=True, slots=True)
class Waste:
    """First-order shares of wall time lost, by cause (they add up to about 1 - efficiency)."""

    saving: float
    """Blocked while saving (including waits for the previous write)."""
    rework: float
    """Steps redone after a failure: half an interval plus the write lag."""
    recovery: float
    """Restart and checkpoint load."""


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """One interval in one mode, evaluated."""

    mode: Mode
    interval_steps: int
    interval_s: float
    """Compute time between two saves."""
    blocked_s: float
    """Training blocked per save, including the wait for the previous write."""
    waited_s: float
    """Part of ``blocked_s`` spent waiting for the previous write (async, write-bound)."""
    efficiency: float
    """Expected share of wall time spent on useful steps."""
    goodput_steps_per_h: float
    """Expected useful steps per hour of wall time."""
    lost_per_day_s: float
    """Expected wall time lost per day: saving, rework and recovery."""
    waste: Waste


@dataclasses.dataclass(frozen=True, slots=True)
class Recommendation:
    """The recommended interval for one mode and where it came from."""

    mode: Mode
    delta_s: float
    """δ: blocked per save."""
    young_s: float
    daly_s: float
    floor_steps: int
    """The async write floor in steps (1 when sync)."""
    binds: Binding
    outcome: Outcome


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """The outcome of ``tune``: recommendations and the current interval, in both modes."""

    inputs: Inputs
    mode: Mode
    """The mode the job uses (the policy's ``[checkpoint] async``): what is recommended."""
    recommended: dict[Mode, Recommendation]
    current: dict[Mode, Outcome]
    """The current interval evaluated in each mode (empty without a current interval)."""
    current_steps: int | None
    advice: str
    notes: tuple[str, ...]

    @property
    def best(self) -> Recommendation:
        return self.recommended[self.mode]


def evaluate(inputs: Inputs, steps: int, mode: Mode) -> Outcome:
    """The expected efficiency of saving every ``steps`` steps in ``mode``."""
    if steps < 1:
        raise ValueError(f"the interval must be at least 1 step (got {steps})")
    tau = steps * inputs.step_s
    waited = inputs.expected_wait_s(tau) if mode == "async" else 0.0
    delta = inputs.blocking_s(mode) + waited
    lag = inputs.lag_s(mode)
    mtbf = inputs.mtbf_s
    eff = efficiency(tau, delta, mtbf, inputs.recovery_s + lag)
    waste = Waste(
        saving=delta / (tau + delta),
        rework=((tau + delta) / 2.0 + lag) / mtbf,
        recovery=inputs.recovery_s / mtbf,
    )
    return Outcome(
        mode=mode,
        interval_steps=steps,
        interval_s=tau,
        blocked_s=delta,
        waited_s=waited,
        efficiency=eff,
        goodput_steps_per_h=eff * 3600.0 / inputs.step_s,
        lost_per_day_s=(1.0 - eff) * _DAY,
        waste=waste,
    )


def recommend(inputs: Inputs, mode: Mode) -> Recommendation:
    """Daly's interval in steps, raised to the async write floor, rounded to a nice count."""
    delta = inputs.blocking_s(mode)
    young_s = young(delta, inputs.mtbf_s)
    daly_s = daly(delta, inputs.mtbf_s)
    floor = inputs.floor_steps(mode)
    raw = daly_s / inputs.step_s
    binds: Binding
    if floor > 1 and raw < floor:
        binds = "write"
        candidates = [nice_at_least(floor)]
    elif raw < 1:
        binds = "step"
        candidates = [nice_at_least(floor)]
    else:
        binds = "failures"
        candidates = sorted({c for c in (nice_at_most(raw), nice_at_least(raw)) if c >= floor})
    outcomes = [evaluate(inputs, c, mode) for c in candidates]
    best = max(outcomes, key=lambda o: o.efficiency)
    return Recommendation(mode, delta, young_s, daly_s, floor, binds, best)


def tune(
    inputs: Inputs,
    *,
    mode: Mode = "async",
    current_steps: int | None = None,
    max_steps: int | None = None,
) -> Report:
    """Recommend an interval for ``mode`` and compare with ``current_steps`` (both modes)."""
    if not inputs.can_evaluate(mode):
        raise ValueError("async saves need the background write time (save_write_s)")
    modes: list[Mode] = [m for m in ("async", "sync") if inputs.can_evaluate(m)]
    recommended = {m: recommend(inputs, m) for m in modes}
    current = {m: evaluate(inputs, current_steps, m) for m in modes} if current_steps is not None else {}
    notes: list[str] = []
    best = recommended[mode]
    if best.delta_s >= 2.0 * inputs.mtbf_s:
        notes.append(
            f"a save blocks for {_d(best.delta_s)}, at least twice the MTBF ({_d(inputs.mtbf_s)}): "
            "Daly's estimate is then one MTBF, and the job barely makes progress"
        )
    if max_steps is not None and best.outcome.interval_steps > max_steps:
        notes.append(
            f"the run is {max_steps} steps long, shorter than the recommended interval: at this "
            "failure rate it would never save; a save at the end is enough"
        )
    advice = _advice(inputs, mode, recommended, current.get(mode))
    return Report(inputs, mode, recommended, current, current_steps, advice, tuple(notes))


def _advice(
    inputs: Inputs, mode: Mode, recommended: dict[Mode, Recommendation], current: Outcome | None
) -> str:
    best = recommended[mode]
    rec = best.outcome
    every = f"{rec.interval_steps:,} steps ({_d(rec.interval_s)})"
    if best.binds == "write":
        return (
            f"Storage-bound: save every {every}, so that the {_d(inputs.write_s('async'))} "
            f"background write (p95 {_d(inputs.write_p95_s())}) is hidden with a "
            f"{inputs.write_margin:g}x margin; failures alone would ask for a save every "
            f"{_d(best.daly_s)}, so faster storage or a smaller state, not a shorter interval, "
            "would let you save more often."
        )
    other = recommended.get("async")
    if mode == "sync" and other is not None and other.outcome.efficiency - rec.efficiency >= 0.005:
        return (
            f"Switch to async saves: training would be blocked {_d(other.delta_s)} instead of "
            f"{_d(best.delta_s)} per save and the expected efficiency would rise from "
            f"{percent(rec.efficiency)} to {percent(other.outcome.efficiency)}."
        )
    if current is not None:
        if mode == "async" and current.interval_steps < best.floor_steps:
            return (
                f"The current interval of {current.interval_steps:,} steps "
                f"({_d(current.interval_s)}) leaves no room to hide the "
                f"{_d(inputs.write_s('async'))} background write: saves wait about "
                f"{_d(current.waited_s)} each for the previous one; save every {every}."
            )
        if current.interval_steps == rec.interval_steps:
            return f"Keep the current interval: {every} is the recommended one."
        if rec.efficiency - current.efficiency < _KEEP_WITHIN:
            return (
                f"Keep the current interval of {current.interval_steps:,} steps: the recommended "
                f"{every} would gain less than 0.1 percentage points of efficiency."
            )
        saved = current.lost_per_day_s - rec.lost_per_day_s
        return (
            f"Save every {every} instead of every {current.interval_steps:,} steps: expected "
            f"efficiency rises from {percent(current.efficiency)} to {percent(rec.efficiency)} "
            f"(about {_d(saved)} less lost per day)."
        )
    if best.binds == "step":
        return (
            f"Save every step: failures (every {_d(inputs.mtbf_s)}) are so frequent that even "
            "one step between saves is longer than the optimum; make failures rarer or recovery faster."
        )
    waste = rec.waste
    if waste.recovery > waste.saving + waste.rework:
        return (
            f"Recovery-bound: save every {every}, but most of the expected loss is the "
            f"{_d(inputs.recovery_s)} of restart and load per failure; faster recovery (in-process "
            "restart, a faster load) gains more than any interval."
        )
    return (
        f"Save every {every}: this balances the {_d(best.delta_s)} blocked per save against the "
        f"rework after a failure every {_d(inputs.mtbf_s)} on average."
    )


def short_duration(seconds: float) -> str:
    """A short human duration: 250ms, 4.2s, 12m30s, 7h54m, 8000h."""
    if seconds < 1:
        return f"{seconds * 1000:.3g}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    whole = round(seconds)
    if whole < 3600:
        m, s = divmod(whole, 60)
        return f"{m}m{s:02d}s" if s else f"{m}m"
    minutes = round(seconds / 60)
    if minutes < 48 * 60:
        h, m = divmod(minutes, 60)
        return f"{h}h{m:02d}m" if m else f"{h}h"
    return f"{round(seconds / 3600)}h"


_d = short_duration


def _sigma(median: float, p95: float) -> float:
    """The lognormal's shape parameter from its median and 95th percentile."""
    if median <= 0.0 or p95 <= median:
        return 0.0
    return min(math.log(p95 / median) / _Z95, _MAX_SIGMA)


def _phi(x: float) -> float:
    """The standard normal distribution function."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def percent(fraction: float) -> str:
    """A percentage with enough digits to show the loss: 97.84%, 99.993%, 99.9996%."""
    if fraction >= 1.0:
        return "100%"
    loss = 1.0 - fraction
    digits = 2 if loss >= 1e-3 else 3 if loss >= 1e-4 else 4
    text = f"{fraction * 100:.{digits}f}%"
    return ">99.9999%" if text.startswith("100") else text


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number above zero (got {value})")


def _not_negative(**values: float) -> None:
    for name, value in values.items():
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0 (got {value})")

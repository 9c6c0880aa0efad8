"""Properties of the interval model over many inputs (hypothesis)."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import assume, given
from hypothesis import strategies as st

from nvtrain.tuning.interval import (
    Inputs,
    Mode,
    daly,
    efficiency,
    evaluate,
    nice_at_least,
    nice_at_most,
    recommend,
    tune,
    young,
)

seconds = st.floats(min_value=1e-3, max_value=1e5, allow_nan=False, allow_infinity=False)
small = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)
mtbfs = st.floats(min_value=60.0, max_value=1e8, allow_nan=False, allow_infinity=False)
steps = st.floats(min_value=1e-3, max_value=600.0, allow_nan=False, allow_infinity=False)
factors = st.floats(min_value=1.001, max_value=100.0, allow_nan=False, allow_infinity=False)
modes = st.sampled_from(["async", "sync"])


@st.composite
def model_inputs(draw: st.DrawFn) -> Inputs:
    write = draw(small)
    return Inputs(
        step_s=draw(steps),
        save_block_s=draw(seconds),
        save_write_s=write,
        mtbf_s=draw(mtbfs),
        restart_s=draw(small),
        restore_s=draw(small),
        save_write_p95_s=draw(st.none() | st.floats(min_value=write, max_value=write * 5 + 1)),
        write_margin=draw(st.floats(min_value=1.0, max_value=3.0)),
    )


@given(seconds, mtbfs, factors)
def test_young_and_daly_grow_with_the_mtbf(delta: float, mtbf: float, factor: float) -> None:
    assume(delta < 2 * mtbf)  # at delta = 2M Daly's estimate jumps to M (see docs)
    assert young(delta, mtbf * factor) > young(delta, mtbf)
    assert daly(delta, mtbf * factor) >= daly(delta, mtbf)


@given(seconds, mtbfs, factors)
def test_young_and_daly_grow_with_the_blocking_time(delta: float, mtbf: float, factor: float) -> None:
    assert young(delta * factor, mtbf) > young(delta, mtbf)
    assert daly(delta * factor, mtbf) >= daly(delta, mtbf) * (1 - 1e-12)


@given(seconds, mtbfs)
def test_daly_is_positive_and_at_most_youngs_first_order_value_plus_a_bit(delta: float, mtbf: float) -> None:
    d = daly(delta, mtbf)
    assert 0 < d <= max(mtbf, young(delta, mtbf) * 1.2)


@given(model_inputs(), factors, modes)
def test_the_recommendation_grows_with_the_mtbf(base: Inputs, factor: float, mode: Mode) -> None:
    assume(base.blocking_s(mode) < 2 * base.mtbf_s)
    more = dataclasses.replace(base, mtbf_s=base.mtbf_s * factor)
    assert recommend(more, mode).outcome.interval_steps >= recommend(base, mode).outcome.interval_steps


@given(model_inputs(), factors, modes)
def test_the_recommendation_grows_with_the_blocking_time(base: Inputs, factor: float, mode: Mode) -> None:
    assume(base.blocking_s(mode) * factor < 2 * base.mtbf_s)
    more = dataclasses.replace(base, save_block_s=base.save_block_s * factor)
    assert recommend(more, mode).outcome.interval_steps >= recommend(base, mode).outcome.interval_steps


@given(model_inputs())
def test_async_never_goes_below_the_write_floor(case: Inputs) -> None:
    best = recommend(case, "async")
    assert best.outcome.interval_steps >= best.floor_steps
    assert best.outcome.interval_s >= case.write_need_s() * (1 - 1e-9)
    assert best.outcome.interval_s >= (case.save_write_s or 0.0) * case.write_margin * (1 - 1e-9)


@given(model_inputs(), st.integers(min_value=1, max_value=10**7), modes)
def test_efficiency_is_a_fraction(case: Inputs, interval: int, mode: Mode) -> None:
    outcome = evaluate(case, interval, mode)
    assert 0.0 <= outcome.efficiency <= 1.0
    assert 0.0 <= outcome.lost_per_day_s <= 86400.0
    assert outcome.goodput_steps_per_h <= 3600.0 / case.step_s * (1 + 1e-9)
    report = tune(case, current_steps=interval)
    for o in [*report.current.values(), *(r.outcome for r in report.recommended.values())]:
        assert 0.0 <= o.efficiency <= 1.0


@given(model_inputs(), st.integers(min_value=1, max_value=10**6), modes, factors)
def test_waste_grows_with_every_cost_and_shrinks_with_the_mtbf(
    case: Inputs, interval: int, mode: Mode, factor: float
) -> None:
    base = evaluate(case, interval, mode).efficiency
    for name in ("restart_s", "restore_s", "save_block_s"):
        worse = dataclasses.replace(case, **{name: getattr(case, name) * factor + 1.0})
        assert evaluate(worse, interval, mode).efficiency <= base + 1e-12, name
    # A slower write: the whole distribution of write times scaled up (same spread).
    write, p95 = case.save_write_s or 0.0, case.save_write_p95_s
    if write > 0:
        worse = dataclasses.replace(
            case, save_write_s=write * factor, save_write_p95_s=None if p95 is None else p95 * factor
        )
    else:
        worse = dataclasses.replace(
            case, save_write_s=1.0, save_write_p95_s=None if p95 is None else p95 * factor + 1.0
        )
    assert evaluate(worse, interval, mode).efficiency <= base + 1e-12, "save_write_s"
    better = dataclasses.replace(case, mtbf_s=case.mtbf_s * factor)
    assert evaluate(better, interval, mode).efficiency >= base - 1e-12


@given(seconds, mtbfs, small)
def test_waste_against_the_interval_falls_then_rises(delta: float, mtbf: float, lost: float) -> None:
    """Efficiency has one peak in the interval: no second dip or rise (sampled on a log grid)."""
    taus = [mtbf * 10 ** (k / 20) for k in range(-100, 41)]
    values = [efficiency(t, delta, mtbf, lost) for t in taus]
    peak = values.index(max(values))
    rising, falling = values[: peak + 1], values[peak:]
    assert all(a <= b + 1e-12 for a, b in zip(rising, rising[1:], strict=False))
    assert all(a >= b - 1e-12 for a, b in zip(falling, falling[1:], strict=False))


@given(st.floats(min_value=0.0, max_value=1e12, allow_nan=False))
def test_nice_numbers_bracket_the_value(value: float) -> None:
    above, below = nice_at_least(value), nice_at_most(value)
    assert above >= value - 1e-9 and above >= 1
    assert below <= max(value, 1) + 1e-9 and below >= 1
    if value >= 10:
        assert above <= value * 4 / 3 + 1e-6
        assert below >= value * 0.75 - 1e-6
    assert nice_at_least(above) == above and nice_at_most(below) == below


@given(model_inputs(), modes)
def test_recommendation_fields_are_consistent(case: Inputs, mode: Mode) -> None:
    best = recommend(case, mode)
    assert math.isclose(best.outcome.interval_s, best.outcome.interval_steps * case.step_s)
    assert best.young_s == young(best.delta_s, case.mtbf_s)
    assert best.binds in ("failures", "write", "step")
    if best.binds == "write":
        assert mode == "async" and best.daly_s < best.floor_steps * case.step_s

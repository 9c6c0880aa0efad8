"""The interval model against published numbers: Young's formula, Daly's worked examples, the
scenarios of design/anchors.md section 4 and the 8-node case where the write left no room."""

from __future__ import annotations

import math

import pytest

from nvtrain.tuning.interval import (
    Inputs,
    daly,
    efficiency,
    evaluate,
    nice_at_least,
    nice_at_most,
    percent,
    recommend,
    short_duration,
    tune,
    young,
)

MIN = 60.0
HOUR = 3600.0


def inputs(**overrides: float | None) -> Inputs:
    values: dict[str, float | None] = {
        "step_s": 1.0,
        "save_block_s": 1.0,
        "save_write_s": 5.0,
        "mtbf_s": 10 * HOUR,
        "restart_s": 60.0,
        "restore_s": 30.0,
    }
    values.update(overrides)
    return Inputs(**values)  # type: ignore[arg-type]


# -- Daly (2006), section 5: delta = 5 min, R = 10 min -------------------------------------------


@pytest.mark.parametrize(
    ("mtbf", "daly_min", "young_min"),
    [(24 * HOUR, 117, 120.0), (6 * HOUR, 57, 60.0), (15 * MIN, 9.1, 12.2)],
)
def test_dalys_worked_examples(mtbf: float, daly_min: float, young_min: float) -> None:
    assert daly(5 * MIN, mtbf) / MIN == pytest.approx(daly_min, abs=0.5 if daly_min > 20 else 0.05)
    assert young(5 * MIN, mtbf) / MIN == pytest.approx(young_min, abs=0.05)


def test_daly_is_the_mtbf_when_a_save_takes_twice_the_mtbf() -> None:
    assert daly(2 * HOUR, 1 * HOUR) == 1 * HOUR
    assert daly(10 * HOUR, 1 * HOUR) == 1 * HOUR
    assert daly(1.999 * HOUR, 1 * HOUR) < 1 * HOUR


@pytest.mark.parametrize(
    ("delta", "mtbf"), [(1.0, 100.0), (6.3, 7.9 * HOUR), (0.78, 1.8 * HOUR), (300, 86400)]
)
def test_youngs_formula(delta: float, mtbf: float) -> None:
    assert young(delta, mtbf) == pytest.approx(math.sqrt(2 * delta * mtbf))
    assert young(delta, mtbf) ** 2 / (2 * delta) == pytest.approx(mtbf)


@pytest.mark.parametrize(
    ("delta", "mtbf_h", "young_min", "daly_min"),
    [
        (6.3, 7.9, 9.98, 9.91),
        (0.78, 7.9, 3.5, 3.5),
        (148.8, 7.9, 48.5, 46.8),
        (0.78, 1.8, 1.7, 1.7),
        (6.3, 1.8, 4.8, 4.7),
    ],
)
def test_scenarios_of_the_design_notes(
    delta: float, mtbf_h: float, young_min: float, daly_min: float
) -> None:
    assert young(delta, mtbf_h * HOUR) / MIN == pytest.approx(young_min, abs=0.05)
    assert daly(delta, mtbf_h * HOUR) / MIN == pytest.approx(daly_min, abs=0.05)


@pytest.mark.parametrize(("restart", "waste"), [(1 * MIN, 0.023), (5 * MIN, 0.032)])
def test_expected_waste_at_1024_gpus(restart: float, waste: float) -> None:
    """design/anchors.md: delta = 6.3 s, M = 7.9 h, tau about 10 min: about 2.3 % (R = 1 min)
    to about 3.2 % (R = 5 min)."""
    sync = inputs(
        step_s=1.0, save_block_s=6.3, save_write_s=None, mtbf_s=7.9 * HOUR, restart_s=restart, restore_s=0
    )
    outcome = evaluate(sync, 600, "sync")
    assert 1 - outcome.efficiency == pytest.approx(waste, abs=0.001)
    first_order = outcome.waste.saving + outcome.waste.rework + outcome.waste.recovery
    assert first_order == pytest.approx(waste, abs=0.001)


@pytest.mark.parametrize(
    ("delta", "mtbf"), [(5 * MIN, 24 * HOUR), (5 * MIN, 6 * HOUR), (0.8, 2 * HOUR), (60, 600)]
)
def test_dalys_interval_is_near_the_exact_optimum_of_the_model(delta: float, mtbf: float) -> None:
    """Daly's estimate approximates the optimum of the complete model whose efficiency we report."""
    best = max(
        efficiency(t, delta, mtbf, 0.0) for t in (daly(delta, mtbf) * f / 1000 for f in range(300, 3000))
    )
    assert efficiency(daly(delta, mtbf), delta, mtbf, 0.0) == pytest.approx(best, rel=2e-3)


def test_efficiency_without_failures_is_the_share_not_blocked() -> None:
    assert efficiency(99.0, 1.0, 1e12, 0.0) == pytest.approx(0.99, rel=1e-6)
    assert efficiency(1.0, 0.0, 1e12, 0.0) == pytest.approx(1.0)
    assert efficiency(1e6, 1.0, 1.0, 0.0) == 0.0  # never finishes a segment


# -- the async write floor -----------------------------------------------------------------------


def test_published_8_node_case_is_storage_bound() -> None:
    """100 steps of 2.8 s (280 s) against a 275 s background write: no room to hide the write."""
    case = inputs(step_s=2.8, save_block_s=0.78, save_write_s=275.0, mtbf_s=7.9 * HOUR)
    report = tune(case, mode="async", current_steps=100)
    best = report.best
    assert best.binds == "write"
    assert best.daly_s < 275.0
    assert best.floor_steps == math.ceil(275.0 * 1.5 / 2.8)
    assert best.outcome.interval_steps >= best.floor_steps
    assert best.outcome.interval_s >= 275.0 * 1.5
    current = report.current["async"]
    assert current.waited_s > 10.0  # a save often waits for the previous write
    assert best.outcome.efficiency > current.efficiency
    assert report.advice.startswith("Storage-bound")
    assert "not a shorter interval" in report.advice


def test_measured_p95_raises_the_floor() -> None:
    case = inputs(step_s=1.0, save_write_s=10.0, save_write_p95_s=40.0, mtbf_s=1 * HOUR)
    assert case.write_need_s() == 40.0
    assert case.floor_steps("async") == 40
    assert case.floor_steps("sync") == 1


def test_sync_saves_block_for_the_whole_save_and_have_no_floor() -> None:
    case = inputs(save_block_s=2.0, save_write_s=30.0)
    sync = recommend(case, "sync")
    assert sync.delta_s == 32.0
    assert sync.floor_steps == 1
    assert evaluate(case, 100, "sync").waited_s == 0.0
    assert evaluate(case, 100, "sync").blocked_s == 32.0


def test_a_sync_job_without_a_write_time_is_tuned_for_sync_only() -> None:
    case = inputs(save_block_s=30.0, save_write_s=None)
    report = tune(case, mode="sync", current_steps=10)
    assert set(report.recommended) == {"sync"}
    assert set(report.current) == {"sync"}
    with pytest.raises(ValueError, match="background write"):
        tune(case, mode="async")


# -- rounding and advice ---------------------------------------------------------------------------


def test_nice_step_counts() -> None:
    assert [nice_at_least(x) for x in (0.2, 1, 7.5, 10, 10.5, 13, 81, 101, 117, 999, 1001)] == [
        1, 1, 8, 10, 12, 15, 100, 120, 120, 1000, 1200,
    ]  # fmt: skip
    assert [nice_at_most(x) for x in (0.2, 1, 7.5, 10, 10.5, 13, 81, 101, 117, 999, 1001)] == [
        1, 1, 7, 10, 10, 12, 80, 100, 100, 800, 1000,
    ]  # fmt: skip


def test_the_recommendation_is_a_nice_neighbour_of_dalys_interval() -> None:
    case = inputs(step_s=1.0, save_block_s=5 * MIN, save_write_s=None, mtbf_s=24 * HOUR)
    best = recommend(case, "sync")
    raw = best.daly_s / case.step_s
    assert best.outcome.interval_steps in (nice_at_most(raw), nice_at_least(raw))
    assert best.binds == "failures"


def test_one_step_when_the_optimum_is_shorter_than_a_step() -> None:
    case = inputs(step_s=600.0, save_block_s=0.01, save_write_s=0.01, mtbf_s=1 * HOUR)
    report = tune(case, mode="async")
    assert report.best.binds == "step"
    assert report.best.outcome.interval_steps == 1
    assert report.advice.startswith("Save every step")


def test_advice_keep_the_current_interval() -> None:
    case = inputs()
    best = recommend(case, "async").outcome.interval_steps
    assert tune(case, current_steps=best).advice.startswith("Keep the current interval")


def test_advice_change_the_interval() -> None:
    report = tune(inputs(), current_steps=10_000)
    assert report.advice.startswith(f"Save every {report.best.outcome.interval_steps:,} steps")
    assert "instead of every 10,000 steps" in report.advice


def test_advice_current_interval_below_the_write_floor() -> None:
    case = inputs(save_write_s=60.0, save_write_p95_s=70.0, save_block_s=1.0, mtbf_s=1000 * HOUR)
    report = tune(case, current_steps=30)
    assert report.best.binds == "failures"
    assert "leaves no room to hide" in report.advice


def test_advice_switch_to_async() -> None:
    case = inputs(save_block_s=1.0, save_write_s=120.0, mtbf_s=2 * HOUR)
    report = tune(case, mode="sync", current_steps=1000)
    assert report.advice.startswith("Switch to async saves")


def test_advice_recovery_bound() -> None:
    case = inputs(save_block_s=0.01, save_write_s=0.1, restart_s=20 * MIN, restore_s=5 * MIN, mtbf_s=2 * HOUR)
    assert tune(case).advice.startswith("Recovery-bound")


def test_notes_for_short_runs_and_huge_saves() -> None:
    report = tune(inputs(), current_steps=10, max_steps=5)
    assert any("shorter than the recommended interval" in n for n in report.notes)
    huge = tune(inputs(save_block_s=3 * HOUR, save_write_s=None, mtbf_s=1 * HOUR), mode="sync")
    assert huge.best.daly_s == 1 * HOUR
    assert any("twice the MTBF" in n for n in huge.notes)


@pytest.mark.parametrize(
    "bad",
    [
        {"step_s": 0.0},
        {"step_s": -1.0},
        {"save_block_s": -0.5},
        {"mtbf_s": 0.0},
        {"mtbf_s": math.inf},
        {"restart_s": -1.0},
        {"save_write_s": -1.0},
        {"write_margin": 0.5},
    ],
)
def test_impossible_inputs_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        inputs(**bad)


def test_evaluate_needs_a_step() -> None:
    with pytest.raises(ValueError, match="at least 1 step"):
        evaluate(inputs(), 0, "async")


def test_formatting_helpers() -> None:
    assert [short_duration(s) for s in (0.25, 4.2, 750, 7.9 * HOUR, 8000 * HOUR)] == [
        "250ms", "4.2s", "12m30s", "7h54m", "8000h",
    ]  # fmt: skip
    assert [percent(x) for x in (0.5, 0.97844, 0.99993, 0.999996, 1 - 1e-9, 1.0)] == [
        "50.00%", "97.84%", "99.9930%", "99.9996%", ">99.9999%", "100%",
    ]  # fmt: skip

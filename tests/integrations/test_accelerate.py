"""An ``accelerate`` loop under ``nvtrain.integrations.accelerate``, for real: a small MLP
(built from its sizes) prepared by an ``Accelerator`` on 2 gloo ranks under ``nvtrain run``, with
an exception, a SIGKILL and a hang, ends bitwise where the fault-free run ends
(``framework_runs``)."""

from __future__ import annotations

import pytest
from framework_runs import (
    check_events_feed_the_report,
    check_layers,
    check_same_losses,
    check_same_state,
    run_pair,
)

from support.worker_helpers import RunResult

pytest.importorskip("accelerate")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    return run_pair(tmp_path_factory, "accelerate_train.py")


def test_recovered_run_ends_bitwise_like_the_clean_run(runs: dict[str, RunResult]) -> None:
    check_same_state(runs)


def test_same_loss_at_every_step(runs: dict[str, RunResult]) -> None:
    check_same_losses(runs)


def test_each_fault_recovered_by_its_layer(runs: dict[str, RunResult]) -> None:
    check_layers(runs)


def test_events_feed_the_report(runs: dict[str, RunResult]) -> None:
    check_events_feed_the_report(runs)

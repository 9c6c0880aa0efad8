"""Lightning under ``nvtrain.integrations.lightning``, for real: a small MLP (built from its
sizes) with DDP on 2 gloo ranks under ``nvtrain run``, with an exception, a SIGKILL and a hang, ends
bitwise where the fault-free run ends (``framework_runs``)."""

from __future__ import annotations

import pytest
from framework_runs import (
    ONE_RANK_FAULTS,
    check_events_feed_the_report,
    check_layers,
    check_one_incident_per_fault,
    check_same_losses,
    check_same_state,
    run_pair,
)

from support.worker_helpers import RunResult

pytest.importorskip("lightning")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    return run_pair(tmp_path_factory, "lightning_train.py")


@pytest.fixture(scope="module")
def one_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    return run_pair(tmp_path_factory, "lightning_train.py", ranks=1, faults=ONE_RANK_FAULTS)


def test_recovered_run_ends_bitwise_like_the_clean_run(runs: dict[str, RunResult]) -> None:
    check_same_state(runs)


def test_one_rank_resumes_mid_epoch_in_the_epochs_own_order(one_rank_runs: dict[str, RunResult]) -> None:
    """One device: Lightning's single-device strategy keeps the loader's ``RandomSampler``, which
    draws the epoch's order from the process's RNG when the epoch starts. A resume mid-epoch must
    make that order again before it skips the batches trained (it once made a new one from the
    checkpoint step's RNG: other batches, another model)."""
    check_same_state(one_rank_runs, ranks=1)
    check_same_losses(one_rank_runs, faults=ONE_RANK_FAULTS)
    check_one_incident_per_fault(one_rank_runs, ONE_RANK_FAULTS)


def test_same_loss_at_every_step(runs: dict[str, RunResult]) -> None:
    check_same_losses(runs)


def test_each_fault_recovered_by_its_layer(runs: dict[str, RunResult]) -> None:
    check_layers(runs)


def test_events_feed_the_report(runs: dict[str, RunResult]) -> None:
    check_events_feed_the_report(runs)


def test_the_model_checkpoint_callbacks_saves_were_replaced(runs: dict[str, RunResult]) -> None:
    """Lightning's default ``ModelCheckpoint`` (a synchronous save per epoch) wrote nothing."""
    for name in ("clean", "faulty"):
        out = runs[name].run_dir.parent.parent / f"out-{name}"
        assert not list(out.rglob("*.ckpt")), sorted(str(p) for p in out.rglob("*"))

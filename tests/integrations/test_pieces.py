"""The integrations' pieces that need no process group: Lightning's resumable data loader and
the optimizer unwrapping (in this process, on CPU)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _order(loader: Any) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def _loader() -> Any:
    data = torch.arange(12)
    return torch.utils.data.DataLoader(
        data, batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(5)
    )


def test_a_resumable_loader_skips_the_trained_batches_then_calls_back() -> None:
    nvpl = pytest.importorskip("nvtrain.integrations.lightning")
    calls: list[int] = []
    fresh = _loader()
    first, second = _order(fresh), _order(fresh)  # two epochs of the same loader
    loader = nvpl.resumable(_loader(), after_skip=lambda: calls.append(1))
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert _order(loader) == first and calls == []  # not resumed: as before
    loader = nvpl.resumable(_loader(), after_skip=lambda: calls.append(1))
    loader.load_state_dict({"batches": 4, "of": 6})
    assert _order(loader) == first[4:] and calls == [1]
    assert _order(loader) == second and calls == [1]  # the next epoch: whole, no call-back


def test_a_resumable_loader_replays_the_order_its_epoch_started_with() -> None:
    """The state holds what decided the epoch's order (the generator's and the process's RNG
    states when its iterator was made): another loader resumed from it draws the same order."""
    nvpl = pytest.importorskip("nvtrain.integrations.lightning")
    saving = nvpl.resumable(_loader())
    order = _order(saving)
    state = saving.state_dict()
    assert state["epoch_start"] is not None
    other = torch.utils.data.DataLoader(
        torch.arange(12), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(99)
    )
    assert _order(other) != order
    calls: list[int] = []
    resumed = nvpl.resumable(other, after_skip=lambda: calls.append(1))
    resumed.load_state_dict({**state, "batches": 2, "of": 6})
    assert _order(resumed) == order[2:] and calls == [1]


def test_a_resumable_loader_saved_at_the_end_of_an_epoch_starts_the_next_whole() -> None:
    nvpl = pytest.importorskip("nvtrain.integrations.lightning")
    calls: list[int] = []
    loader = nvpl.resumable(_loader(), after_skip=lambda: calls.append(1))
    reference = _order(_loader())  # (the order a fresh loader draws; the resumed one's
    # generator state is set by Lightning's restore in a real run)
    loader.load_state_dict({"batches": 6, "of": 6})
    assert _order(loader) == reference and calls == [1]  # RNG set again before the epoch


def test_a_resumable_loader_is_what_lightning_takes_for_stateful_and_survives_a_rebuild() -> None:
    """Lightning re-creates a loader with a distributed sampler through ``type(loader)``."""
    nvpl = pytest.importorskip("nvtrain.integrations.lightning")
    from lightning.fabric.utilities.types import _Stateful

    loader = nvpl.resumable(_loader())
    assert isinstance(loader, _Stateful)
    rebuilt = type(loader)(torch.arange(12), batch_size=3)
    assert isinstance(rebuilt, _Stateful) and len(_order(rebuilt)) == 4
    assert nvpl.resumable(object()) is not None  # anything else is left as it is


def test_unwrap_optimizer_finds_the_torch_optimizer_or_says_what_it_found() -> None:
    from nvtrain.integrations.core import IntegrationError, unwrap_optimizer

    inner = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)

    class Wrapper:
        def __init__(self, optimizer: Any) -> None:
            self.optimizer = optimizer

    assert unwrap_optimizer(inner) is inner
    assert unwrap_optimizer(Wrapper(Wrapper(inner))) is inner
    with pytest.raises(
        IntegrationError, match=r"the optimizer is a .*\.Wrapper, not a torch\.optim\.Optimizer"
    ):
        unwrap_optimizer(Wrapper(object()))


def test_a_modules_train_dataloader_returns_resumable_loaders_during_fit_only() -> None:
    """``fit`` without loaders makes what the module's (or datamodule's) ``train_dataloader()``
    returns resumable; afterwards the module's own method is back."""
    nvpl = pytest.importorskip("nvtrain.integrations.lightning")

    class Source:
        def train_dataloader(self) -> Any:
            return [_loader(), _loader()]

    source = Source()
    with nvpl._resumable_from(source, lambda: None):
        loaders = source.train_dataloader()
        assert all(callable(getattr(loader, "load_state_dict", None)) for loader in loaders)
    assert "train_dataloader" not in vars(source)
    assert not hasattr(source.train_dataloader()[0], "load_state_dict")


def test_an_accelerate_loop_says_what_it_cannot_work_with() -> None:
    nvacc = pytest.importorskip("nvtrain.integrations.accelerate")
    from nvtrain.integrations.core import IntegrationError

    with pytest.raises(
        IntegrationError, match=r"Loop\(max_steps=0\): the number of optimizer steps must be >= 1"
    ):
        nvacc.Loop(None, None, None, None, _loader(), max_steps=0)
    endless = (torch.zeros(2) for _ in range(3))
    with pytest.raises(
        IntegrationError, match=r"a generator has no length; .* needs a map-style data loader"
    ):
        nvacc.Loop(None, None, None, None, endless, max_steps=5)

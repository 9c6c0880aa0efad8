"""The autouse fixture in conftest.py hides the launcher's and the developer's environment."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

PROBES = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "NVTRAIN_PROBE": "1",
    "PET_NNODES": "2",
}
KEPT = {"NVTRAINX_TEST_PROBE": "1", "X_RANK_TEST_PROBE": "1", "PETX_TEST_PROBE": "1"}


@pytest.fixture(scope="module")
def probes() -> Iterator[None]:
    """Module scope: set up before the function-scoped autouse fixture that must remove them."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {**PROBES, **KEPT}.items():
            mp.setenv(name, value)
        yield


@pytest.mark.usefixtures("probes")
def test_launcher_variables_are_removed() -> None:
    leaked = sorted(
        name
        for name in os.environ
        if name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        or name.startswith(("TORCHELASTIC_", "NVTRAIN_", "PET_"))
    )
    assert leaked == []


@pytest.mark.usefixtures("probes")
def test_other_variables_are_kept() -> None:
    for name, value in KEPT.items():
        assert os.environ.get(name) == value

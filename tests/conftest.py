"""Shared test set-up: a clean environment for every test and the hypothesis profiles."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# "ci" (the default) runs the same examples every time, so a failure is never a fluke;
# HYPOTHESIS_PROFILE=explore searches longer with fresh random examples.
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True, print_blob=True)
settings.register_profile("explore", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Variables set by torchrun, ft_launcher, Kubernetes, Slurm or a developer's shell that would change
# what nvtrain does (off a pod, in a Slurm step); no test may depend on them.
CLEARED_NAMES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
    "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
)  # fmt: skip
CLEARED_PREFIXES = ("TORCHELASTIC_", "NVTRAIN_", "PET_", "SLURM_", "SLURMD_")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in CLEARED_NAMES or name.startswith(CLEARED_PREFIXES):
            monkeypatch.delenv(name)

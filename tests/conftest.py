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

# Variables set by torchrun, ft_launcher, Kubernetes or a developer's shell that would change what
# nvtrain does; no test may depend on them.
CLEARED_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
CLEARED_PREFIXES = ("TORCHELASTIC_", "NVTRAIN_", "PET_")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in CLEARED_NAMES or name.startswith(CLEARED_PREFIXES):
            monkeypatch.delenv(name)


# The order the test files are handed to the xdist processes (``--dist loadfile`` takes them as
# collected): the longest runs first, then the other slow files, the fast ones last, so that at
# the end of a CI run both cores still have short work instead of one waiting for a 2-minute
# job to finish. The heaviest files by wall time in CI (``--durations``), longest first.
FIRST = (
    "tests/multinode/test_run_multinode.py",
    "tests/worker/test_recovery.py",
    "tests/worker/test_fault_matrix.py",
    "tests/multinode/test_fault_matrix_pods.py",
    "tests/multinode/test_lost_pod.py",
    "tests/process/test_nvrx_clients.py",
    "tests/process/test_run_faults.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::")[0]
        if path in FIRST:
            return (0, FIRST.index(path))
        return (1 if item.get_closest_marker("slow") is not None else 2, 0)

    # Stable: a file's tests stay together and in their order (module fixtures are shared).
    items.sort(key=rank)

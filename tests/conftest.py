"""Shared test set-up: a clean environment for every test, the hypothesis profiles, the fixtures of
``support/`` and the one warning filter that tests importing torch need.

The tests mirror ``src/nvtrain/``: ``tests/<package>/`` for each package, ``tests/top/`` for the
top-level modules. Helpers shared across folders live in ``tests/support/`` (imported as
``support.<module>``: this folder is on ``sys.path`` because pytest puts a root conftest's folder
there), the scripts the tests run as real processes in ``tests/support/bin/``. There is no
``__init__.py`` under tests/, so two test files must never share a basename.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# "ci" (the default) runs the same examples every time, so a failure is never a fluke;
# HYPOTHESIS_PROFILE=explore searches longer with fresh random examples.
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True, print_blob=True)
settings.register_profile("explore", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# ``nvtrain`` and ``mount`` (real ``nvtrain run`` children), ``warm_server`` (ranks forked warm).
pytest_plugins = ("support.process_fixtures", "support.worker_fixtures")

# The tests of these folders import torch in the test process. torch 2.13's ``torch.cuda`` imports
# ``pynvml``, which (in this environment) is a redirecting shim that emits a ``FutureWarning``; with
# ``filterwarnings = error`` that warning would make ``import torch`` itself fail. Exactly that
# warning is ignored there, and nowhere else.
TORCH_FOLDERS = ("worker", "demo", "integrations")
PYNVML_DEPRECATION = "ignore:The pynvml package is deprecated:FutureWarning"
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    folders = [_HERE / name for name in TORCH_FOLDERS]
    for item in items:
        parents = Path(str(item.path)).resolve().parents
        if any(folder in parents for folder in folders):
            item.add_marker(pytest.mark.filterwarnings(PYNVML_DEPRECATION))


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

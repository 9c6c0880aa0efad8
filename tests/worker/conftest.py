"""Set-up of the worker-library tests (``nvtrain.worker``, the demo); helpers in ``worker_helpers.py``.

These tests import torch in the test process. torch 2.13's ``torch.cuda`` imports ``pynvml``,
which (in this environment) is a redirecting shim that emits a ``FutureWarning``; with
``filterwarnings = error`` that warning would make ``import torch`` itself fail. Exactly that
warning is ignored here, for the tests of this folder only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_helpers import WarmServer

PYNVML_DEPRECATION = "ignore:The pynvml package is deprecated:FutureWarning"
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.filterwarnings(PYNVML_DEPRECATION))


@pytest.fixture(scope="session")
def warm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmServer]:
    """One warm-start server per test process, for the ranks the tests run themselves."""
    server = WarmServer(tmp_path_factory.mktemp("warm-server"))
    try:
        yield server
    finally:
        server.close()

"""Set-up of the framework-integration tests: the worker tests' helpers (``worker_helpers``)
are importable here too, and, as in tests/worker, the ``FutureWarning`` that ``import torch``
emits through this environment's pynvml shim is ignored for the tests of this folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
_WORKER_TESTS = str(_HERE.parent / "worker")
if _WORKER_TESTS not in sys.path:
    sys.path.insert(0, _WORKER_TESTS)

PYNVML_DEPRECATION = "ignore:The pynvml package is deprecated:FutureWarning"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.filterwarnings(PYNVML_DEPRECATION))

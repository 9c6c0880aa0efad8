"""Set-up of the worker-library tests (``nvtrain.worker``, the demo); helpers in ``worker_helpers.py``.

These tests import torch in the test process. torch 2.13's ``torch.cuda`` imports ``pynvml``,
which (in this environment) is a redirecting shim that emits a ``FutureWarning``; with
``filterwarnings = error`` that warning would make ``import torch`` itself fail. Exactly that
warning is ignored here, for the tests of this folder only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

PYNVML_DEPRECATION = "ignore:The pynvml package is deprecated:FutureWarning"
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.filterwarnings(PYNVML_DEPRECATION))

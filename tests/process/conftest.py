"""Fixtures of the process tests; the helpers live in ``proc_helpers.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from proc_helpers import NvtrainRunner


@pytest.fixture
def nvtrain(tmp_path: Path) -> Iterator[NvtrainRunner]:
    """Starts ``nvtrain run`` children; kills whatever they left when the test ends."""
    runner = NvtrainRunner(tmp_path)
    try:
        yield runner
    finally:
        runner.close()

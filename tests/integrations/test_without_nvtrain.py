"""Without ``nvtrain run`` an integrated script still runs as before: ``python script.py`` is a
one-rank run with the worker library's debug defaults (no in-process restart, checkpoints under
``./checkpoints``), and trains to the end."""

from __future__ import annotations

from pathlib import Path

import pytest
from framework_runs import BIN, FINGERPRINT_LINE, LOSS_LINE

from support.worker_helpers import run_python

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("script", "framework"),
    [
        ("hf_train.py", "transformers"),
        ("lightning_train.py", "lightning"),
        ("accelerate_train.py", "accelerate"),
    ],
)
def test_plain_python_runs_the_script(script: str, framework: str, tmp_path: Path) -> None:
    pytest.importorskip(framework)
    result = run_python([str(BIN / script), "--steps", "6", "--out", str(tmp_path / "out")], tmp_path, 120)
    tail = result.stdout[-3000:]
    assert result.returncode == 0, tail
    assert [int(step) for step, _ in LOSS_LINE.findall(result.stdout)] == list(range(1, 7)), tail
    assert [int(rank) for rank, _ in FINGERPRINT_LINE.findall(result.stdout)] == [0], tail

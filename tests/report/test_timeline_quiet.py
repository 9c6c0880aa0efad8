"""``nvtrain report`` draws its PNG timeline without a word from matplotlib: neither the
temporary cache folder it makes when its config folder cannot be used, nor a font it cannot
find reaches stderr. The PNG is written all the same."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.report_logs import V0_LOG

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def report_timeline(tmp_path: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """``nvtrain report`` of the v0 log in a process of its own (matplotlib is imported afresh)
    with matplotlib's config folder ``config``."""
    env = {**os.environ, "MPLCONFIGDIR": str(config)}
    png = tmp_path / "timeline.png"
    result = subprocess.run(
        [sys.executable, "-m", "nvtrain", "report", str(V0_LOG), "--timeline", str(png)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    return result


@pytest.mark.parametrize("config", ["a-file", "a-missing-font"])
def test_report_prints_no_matplotlib_warning(tmp_path: Path, config: str) -> None:
    pytest.importorskip("matplotlib")
    folder = tmp_path / "mpl"
    if config == "a-file":  # not a folder: matplotlib warns and makes a temporary one
        folder.write_text("", encoding="utf-8")
    else:  # a font that is not installed: matplotlib warns that it falls back to another one
        folder.mkdir()
        (folder / "matplotlibrc").write_text("font.family: NoSuchFontAnywhere\n", encoding="utf-8")
    result = report_timeline(tmp_path, folder)
    assert "warning" not in result.stderr.lower(), result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith("run events-v0: ")

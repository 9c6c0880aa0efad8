"""``nvtrain control`` through the command: what it refuses, before any process starts.

The store process itself (NVRx 0.6+ ``nvrx-control``) cannot be installed where CI runs (NVRx
0.4.1); it was run on NVRx 0.6.0 and 0.7.0 by benchmarks/recovery/pod0_loss.py --store control
(BENCHMARKS.md, "Losing pod 0"). The argv it gets is pinned in tests/launcher/test_plan.py."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.nvrx import installed_nvrx

runner = CliRunner()

POLICY = """\
[job]
name = "ctl"
script = "train.py"

[rendezvous]
nodes = 2
store = "{store}"
"""


def test_a_policy_with_the_store_in_pod0_is_refused_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(POLICY.format(store="pod0"), encoding="utf-8")
    result = runner.invoke(app, ["control", str(path), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert 'store = "pod0"' in result.stderr and 'store = "control"' in result.stderr
    assert "Traceback" not in result.output


def test_store_control_on_nvrx_0_4_is_an_invalid_policy(tmp_path: Path) -> None:
    version = installed_nvrx()
    assert version is not None and not version.has_control_plane, "CI pins NVRx 0.4.1"
    path = tmp_path / "p.toml"
    path.write_text(POLICY.format(store="control"), encoding="utf-8")
    result = runner.invoke(app, ["control", str(path)])
    assert result.exit_code == 2, result.output
    assert "[rendezvous] store" in result.stderr and "nvrx-control arrived in 0.6" in result.stderr
    assert "Traceback" not in result.output

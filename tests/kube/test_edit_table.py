"""``nvtrain validate --manifest --strict`` against a table of post-render edits, through the
real ``kubectl kustomize``.

The cases are data (tests/kube/edits/*.yaml): each names a base (a render of ``BASES``), the
lines of a kustomization after ``resources: [job.yaml]`` (overlays, strategic-merge and JSON 6902
patches, ``$patch: delete``, namePrefix/nameSuffix, namespace, images, labels...), and what
``validate`` must say: ``pass`` (exit 0 under ``--strict``), or the code (and the key or the
object) of the error or warning that catches the edit. Each base is rendered once, each case is
one ``kubectl kustomize``. Skipped where ``kubectl`` is not installed; with
``NVTRAIN_KUBECTL=require`` (CI sets it) that fails instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from templates_helpers import set_keys, starter_two_nodes, with_control_store
from typer.testing import CliRunner

from nvtrain.cli import app

ROOT = Path(__file__).resolve().parents[2]
EDITS = Path(__file__).resolve().parent / "edits"
KUBECTL = shutil.which("kubectl")
if KUBECTL is None and os.environ.get("NVTRAIN_KUBECTL", "").strip().lower() == "require":
    raise RuntimeError(
        "NVTRAIN_KUBECTL=require but kubectl is not installed (apt-get install kubernetes-client)"
    )
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

runner = CliRunner()

_CONTROL = with_control_store(starter_two_nodes())
_METRICS = set_keys(_CONTROL, {("metrics", "enabled"): "true"})
_POD0 = set_keys(_METRICS, {("rendezvous", "store"): '"pod0"'})
_JOBSET = set_keys(_METRICS, {("job", "name"): '"my-training-workers-0"'})

BASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "plain": (_CONTROL, ()),
    "metrics": (_METRICS, ("--pod-monitor", "--monitoring-rules")),
    "pod0": (_POD0, ()),
    "restricted": (_CONTROL, ("--pod-security", "restricted")),
    "volcano": (_METRICS, ("--scheduler-name", "volcano", "--queue", "q1")),
    "jobset": (_JOBSET, ("--jobset", "--pod-monitor", "--pod-security", "restricted")),
    "runtime": (_POD0, ("--trainer-runtime", "namespaced")),
}
"""Policy text and ``nvtrain manifest`` options of each base render."""


def _cases() -> list[dict[str, Any]]:
    cases = [c for f in sorted(EDITS.glob("*.yaml")) for c in yaml.safe_load(f.read_text(encoding="utf-8"))]
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "two cases with one name"
    return cases


CASES = _cases()


def _documented_names() -> str:
    """The nameReference configuration of docs/kubernetes.md, "Kustomize"."""
    page = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(# nvtrain-names\.yaml.*?)```", page, re.DOTALL)
    assert block is not None
    return block.group(1)


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each base rendered once (and checked to pass as rendered)."""
    root = tmp_path_factory.mktemp("bases")
    out = {}
    for name, (text, args) in BASES.items():
        policy = root / f"{name}.toml"
        policy.write_text(text, encoding="utf-8")
        manifest = root / f"{name}.yaml"
        result = runner.invoke(app, ["manifest", str(policy), "--nvrx", "0.7.0", "-o", str(manifest), *args])
        assert result.exit_code == 0, result.output
        code, data = _validate(manifest)
        assert code == 0, (name, [f for f in data["findings"] if f["severity"] != "info"])
        out[name] = manifest
    return out


def _validate(manifest: Path) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["validate", "--manifest", str(manifest), "--strict", "--json"])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, json.loads(result.stdout)


def _kustomize(directory: Path, base: Path, case: dict[str, Any]) -> Path:
    directory.mkdir()
    shutil.copy(base, directory / "job.yaml")
    text = "resources:\n- job.yaml\n" + case["kustomization"]
    (directory / "kustomization.yaml").write_text(text, encoding="utf-8")
    for name, content in (case.get("files") or {}).items():
        body = _documented_names() if content == "documented" else content
        (directory / name).write_text(body, encoding="utf-8")
    assert KUBECTL is not None
    proc = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = directory.parent / f"{directory.name}.yaml"
    out.write_text(proc.stdout, encoding="utf-8")
    return out


def _shown(findings: list[dict[str, Any]]) -> list[tuple[str, str, str, str | None]]:
    return [(f["severity"], f["code"], f["table"], f["key"]) for f in findings if f["severity"] != "info"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_edit(case: dict[str, Any], bases: dict[str, Path], tmp_path: Path) -> None:
    out = _kustomize(tmp_path / "edit", bases[case["base"]], case)
    code, data = _validate(out)
    expect = case["expect"]
    if expect == "pass":
        assert code == 0, _shown(data["findings"])
        return
    assert code != 0, f"not caught: {case['name']}"
    caught = [
        f
        for f in data["findings"]
        if f["severity"] in ("error", "warning")
        and f["code"] == expect["code"]
        and ("key" not in expect or f["key"] == expect["key"])
        and ("table" not in expect or f["table"].startswith(expect["table"]))
    ]
    assert caught, (expect, _shown(data["findings"]))
    assert all(f["rule"] and f["fix"] for f in caught)


def test_the_table_covers_every_kind_of_edit() -> None:
    """At least 60 cases, both outcomes, every base, and each way of editing."""
    assert len(CASES) >= 60
    assert {c["base"] for c in CASES} == set(BASES)
    text = "\n".join(c["kustomization"] for c in CASES)
    for way in ("$patch: delete", "op: ", "namePrefix", "nameSuffix"):
        assert way in text, way
    assert re.search(r"patch: \|\n *apiVersion", text), "no strategic-merge patch"
    for way in ("namespace:", "images:", "labels:", "commonLabels", "commonAnnotations"):
        assert way in text, way
    outcomes = [c["expect"] == "pass" for c in CASES]
    assert sum(outcomes) >= 17 and outcomes.count(False) >= 40

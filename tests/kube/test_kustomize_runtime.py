"""The names recipe of docs/kubernetes.md ("Kustomize", ``nvtrain-names.yaml``) on a Trainer
runtime (``--trainer-runtime namespaced``), with the real ``kubectl kustomize``: a ``namePrefix``
renames the ConfigMap and, with the recipe, the runtime pods' ConfigMap volume; ``commonLabels``
reaches the runtime's pods, which the NetworkPolicy then selects. Without the recipe ``nvtrain
validate --manifest --strict`` reports both. Skipped where ``kubectl`` is not installed; with
``NVTRAIN_KUBECTL=require`` (CI) that fails instead.
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
from templates_helpers import starter_two_nodes
from typer.testing import CliRunner

from nvtrain.cli import app

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")
if KUBECTL is None and os.environ.get("NVTRAIN_KUBECTL", "").strip().lower() == "require":
    raise RuntimeError(
        "NVTRAIN_KUBECTL=require but kubectl is not installed (apt-get install kubernetes-client)"
    )
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

runner = CliRunner()
KUSTOMIZATION = """\
namePrefix: exp1-
namespace: team-a
commonLabels:
  nvtrain.dev/experiment: exp1
resources:
- job.yaml
"""
POD = ("spec", "template", "spec", "replicatedJobs", 0, "template", "spec", "template")


def recipe() -> str:
    """The documented ``nvtrain-names.yaml``."""
    page = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    section = page.split("\n## Kustomize\n", 1)[1].split("\n## ", 1)[0]
    [block] = [
        b
        for b in re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
        if b.startswith("# nvtrain-names.yaml")
    ]
    return block


def kustomized(tmp_path: Path, names: str | None) -> tuple[Path, list[dict[str, Any]]]:
    directory = tmp_path / "exp1"
    directory.mkdir()
    policy = tmp_path / "policy.toml"
    policy.write_text(starter_two_nodes(), encoding="utf-8")
    args = ["manifest", str(policy), "--trainer-runtime", "namespaced", "-o", str(directory / "job.yaml")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    kustomization = KUSTOMIZATION
    if names is not None:
        (directory / "nvtrain-names.yaml").write_text(names, encoding="utf-8")
        kustomization += "configurations:\n- nvtrain-names.yaml\n"
    (directory / "kustomization.yaml").write_text(kustomization, encoding="utf-8")
    assert KUBECTL is not None
    proc = subprocess.run([KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "exp1.yaml"
    out.write_text(proc.stdout, encoding="utf-8")
    return out, [d for d in yaml.safe_load_all(proc.stdout) if d]


def at(doc: dict[str, Any], path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def validate(manifest: Path) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["validate", "--manifest", str(manifest), "--strict", "--json"])
    assert "Traceback" not in result.output
    return result.exit_code, json.loads(result.stdout)


def test_the_recipe_renames_the_runtime_pods_configmap_and_labels_them(tmp_path: Path) -> None:
    out, docs = kustomized(tmp_path, recipe())
    [configmap] = [d for d in docs if d["kind"] == "ConfigMap"]
    [runtime] = [d for d in docs if d["kind"] == "TrainingRuntime"]
    pod = at(runtime, POD)
    assert configmap["metadata"]["name"].startswith("exp1-")
    assert pod["spec"]["volumes"][0]["configMap"]["name"] == configmap["metadata"]["name"]
    assert pod["metadata"]["labels"]["nvtrain.dev/experiment"] == "exp1"
    code, data = validate(out)
    assert code == 0, data["findings"]
    assert (data["errors"], data["warnings"]) == (0, 0), data["findings"]


def test_without_the_recipe_validate_reports_the_runtime(tmp_path: Path) -> None:
    out, docs = kustomized(tmp_path, None)
    [runtime] = [d for d in docs if d["kind"] == "TrainingRuntime"]
    assert not at(runtime, POD)["spec"]["volumes"][0]["configMap"]["name"].startswith("exp1-")
    code, data = validate(out)
    assert code != 0, data["findings"]

"""``nvtrain manifest --owner-script``: the script that, after ``kubectl apply``, makes the Job (or
the JobSet) own the job's other objects. Run for real with ``sh`` against a stand-in ``kubectl``
(``KUBECTL``) that records its arguments and answers the UID; each patched object, with its new
owner reference, is then checked against its schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from templates_helpers import (
    KUBERNETES_VERSIONS,
    object_errors,
    policy_of,
    set_keys,
    starter_named,
    with_control_store,
)
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.errors import UsageError
from nvtrain.kube.manifest import render
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.ownership import owner_script, resource_type

runner = CliRunner()

UID = "0b6f3c8e-1c1d-4c4e-9a55-6f2d2b7f1a10"
TEXT = set_keys(with_control_store(starter_named("llm-workers-0")), {("metrics", "enabled"): "true"})


def fake_kubectl(tmp_path: Path, uid: str) -> tuple[Path, Path]:
    """A ``kubectl`` that writes each call's arguments as one JSON line and prints ``uid`` for ``get``."""
    log = tmp_path / "calls.jsonl"
    tool = tmp_path / "kubectl"
    tool.write_text(
        "#!/bin/sh\n"
        f'"{sys.executable}" -c \'import json, sys; print(json.dumps(sys.argv[1:]))\' "$@" >> {log}\n'
        f'if [ "$1" = get ]; then printf %s "{uid}"; fi\n',
        encoding="utf-8",
    )
    tool.chmod(0o755)
    return tool, log


def run_script(
    tmp_path: Path, objects: list[dict[str, Any]], uid: str = UID
) -> tuple[int, str, list[list[str]]]:
    script = tmp_path / "owners.sh"
    script.write_text(owner_script(objects, "job.yaml"), encoding="utf-8")
    tool, log = fake_kubectl(tmp_path, uid)
    done = subprocess.run(
        ["sh", str(script)],
        env={"KUBECTL": str(tool), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = (
        [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []
    )
    return done.returncode, done.stderr, calls


@pytest.mark.parametrize("jobset", [False, True])
def test_the_script_gives_every_other_object_an_owner_reference(tmp_path: Path, jobset: bool) -> None:
    options = ManifestOptions(jobset=jobset, pod_monitor=True, monitoring_rules=True)
    objects = render(policy_of(TEXT), TEXT, options)
    owner = next(
        o
        for o in objects
        if o["kind"] == ("JobSet" if jobset else "Job") and "control" not in o["metadata"]["name"]
    )
    code, stderr, calls = run_script(tmp_path, objects)
    assert code == 0, stderr
    get, *patches = calls
    assert get[:3] == ["get", resource_type(owner), owner["metadata"]["name"]]
    dependents = [o for o in objects if o is not owner]
    assert [(c[1], c[2]) for c in patches] == [(resource_type(o), o["metadata"]["name"]) for o in dependents]
    if not jobset:  # the control Job goes with the training Job
        assert ("job.batch", "llm-workers-0-control") in [(c[1], c[2]) for c in patches]
    for call, obj in zip(patches, dependents, strict=True):
        assert call[3:7] == ["-n", obj["metadata"]["namespace"], "--type=merge", "-p"]
        patch = json.loads(call[7])
        [reference] = patch["metadata"]["ownerReferences"]
        assert reference == {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": UID,
        }
        patched = {**obj, "metadata": {**obj["metadata"], **patch["metadata"]}}
        for version in KUBERNETES_VERSIONS:
            assert object_errors(patched, version) == []


def test_without_a_uid_the_script_patches_nothing(tmp_path: Path) -> None:
    objects = render(policy_of(TEXT), TEXT, ManifestOptions())
    code, stderr, calls = run_script(tmp_path, objects, uid="")
    assert code == 1
    assert "has no UID yet: kubectl apply -f job.yaml first" in stderr
    assert [c[0] for c in calls] == ["get"]


def test_a_strange_manifest_path_stays_text(tmp_path: Path) -> None:
    objects = render(policy_of(TEXT), TEXT, ManifestOptions())
    path = 'it\'s $(touch pwned) "x"\nnext.yaml'
    script = tmp_path / "owners.sh"
    script.write_text(owner_script(objects, path), encoding="utf-8")
    tool, _ = fake_kubectl(tmp_path, "")
    done = subprocess.run(
        ["sh", str(script)],
        cwd=tmp_path,
        env={"KUBECTL": str(tool), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert path in done.stderr and not (tmp_path / "pwned").exists()


def test_a_trainer_runtime_has_no_owner() -> None:
    text = starter_named("llm-train")
    objects = render(policy_of(text), text, ManifestOptions(trainer_runtime="cluster"))
    with pytest.raises(UsageError, match="--owner-script needs a Job or a JobSet"):
        owner_script(objects, "job.yaml")


def test_the_cli_writes_an_executable_script(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(TEXT, encoding="utf-8")
    script = tmp_path / "owners.sh"
    result = runner.invoke(
        app, ["manifest", str(policy), "-o", str(tmp_path / "job.yaml"), "--owner-script", str(script)]
    )
    assert result.exit_code == 0, result.output
    assert script.stat().st_mode & 0o111
    assert subprocess.run(["sh", "-n", str(script)], timeout=60).returncode == 0
    same = runner.invoke(app, ["manifest", str(policy), "--owner-script", str(policy)])
    assert same.exit_code == 2 and "--owner-script" in same.stderr and "fix:" in same.stderr

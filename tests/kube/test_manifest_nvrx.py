"""``nvtrain manifest --nvrx``: the policy is checked against the NVRx version of the image, the
version is recorded in the pods, and ``nvtrain validate --manifest`` checks the policy in the
manifest against that version; ``nvtrain init`` tells both steps the version its Dockerfile pins."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from templates_helpers import set_keys, starter_named, starter_two_nodes
from typer.testing import CliRunner, Result

from nvtrain.cli import app
from nvtrain.kube.init import starter_nvrx_version, starter_text
from nvtrain.kube.manifest import render
from nvtrain.kube.nvrx_pin import NVRX_ANNOTATION
from nvtrain.kube.options import ManifestOptions

runner = CliRunner()

STARTER = starter_two_nodes()
MIN_HEALTHY = set_keys(STARTER, {("restart.in_job", "policy"): '"min-healthy"'})
"""Valid on NVRx 0.4 only: 0.6 removed the min-healthy restart policy."""


def invoke(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


def manifest(tmp_path: Path, text: str, *args: str) -> tuple[Result, Path]:
    policy = tmp_path / "policy.toml"
    policy.write_text(text, encoding="utf-8")
    out = tmp_path / "job.yaml"
    return invoke("manifest", str(policy), "-o", str(out), *args), out


def pod_annotations(path: Path) -> list[dict[str, str] | None]:
    """The annotations of every pod template, in file order (None: no annotations)."""
    found = []
    for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        if doc["kind"] not in ("Job", "JobSet"):
            continue
        spec = doc["spec"]
        if doc["kind"] == "JobSet":
            spec = spec["replicatedJobs"][0]["template"]["spec"]
        found.append(spec["template"]["metadata"].get("annotations"))
    return found


def validate_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = invoke("validate", *args, "--json")
    data: dict[str, Any] = json.loads(result.stdout)
    return result.exit_code, data


# -- nvtrain manifest --nvrx -------------------------------------------------------------------


@pytest.mark.parametrize("jobset", [False, True])
def test_the_version_is_recorded_in_the_training_pods(tmp_path: Path, jobset: bool) -> None:
    text = starter_named("llm-workers-0") if jobset else STARTER
    result, out = manifest(tmp_path, text, "--nvrx", "0.7", *(["--jobset"] if jobset else []))
    assert result.exit_code == 0, result.output
    assert pod_annotations(out) == [{NVRX_ANNOTATION: "0.7.0"}]  # written out in full


def test_the_control_pod_records_nothing_and_without_the_flag_nothing_is_recorded(tmp_path: Path) -> None:
    text = set_keys(STARTER, {("rendezvous", "store"): '"control"'})
    result, out = manifest(tmp_path, text, "--nvrx", "0.7.0")
    assert result.exit_code == 0, result.output
    assert pod_annotations(out) == [None, {NVRX_ANNOTATION: "0.7.0"}]  # control Job, training Job
    result, out = manifest(tmp_path, STARTER)
    assert result.exit_code == 0 and NVRX_ANNOTATION not in out.read_text(encoding="utf-8")


def test_a_rule_of_the_image_version_fails_the_render(tmp_path: Path) -> None:
    result, out = manifest(tmp_path, MIN_HEALTHY, "--nvrx", "0.7.0")
    assert result.exit_code == 2
    assert not out.exists()
    assert 'policy = "min-healthy"' in result.stderr
    assert "NVRx 0.7.0 has no min-healthy restart policy" in result.stderr
    assert manifest(tmp_path, MIN_HEALTHY, "--nvrx", "0.4.1")[0].exit_code == 0
    assert manifest(tmp_path, MIN_HEALTHY)[0].exit_code == 0  # no version: no version rules


@pytest.mark.parametrize("value", ["banana", "", "latest"])
def test_a_bad_version_is_a_usage_error(tmp_path: Path, value: str) -> None:
    result, out = manifest(tmp_path, STARTER, "--nvrx", value)
    assert result.exit_code == 2
    assert result.stderr == (
        f"nvtrain: error: --nvrx {value!r} is not a version\n  fix: give a version such as 0.4.1 or 0.7.0\n"
    )
    assert not out.exists()


def test_the_library_refuses_a_bad_version_and_the_annotation_as_an_extra_annotation() -> None:
    from nvtrain.config.validation import validate_source
    from nvtrain.errors import UsageError

    policy = validate_source(STARTER, "starter", nvrx=None).policy
    assert policy is not None
    with pytest.raises(UsageError, match="--nvrx 'x' is not a version"):
        render(policy, STARTER, ManifestOptions(nvrx_version="x"))
    with pytest.raises(UsageError, match="is set by nvtrain"):
        render(policy, STARTER, ManifestOptions(annotations={NVRX_ANNOTATION: "0.7.0"}))


# -- nvtrain validate --manifest: the recorded version ----------------------------------------


def test_validate_checks_the_manifests_policy_for_the_recorded_version(tmp_path: Path) -> None:
    result, out = manifest(tmp_path, MIN_HEALTHY, "--nvrx", "0.4.1")
    assert result.exit_code == 0, result.output
    code, data = validate_json("--manifest", str(out), "--strict")
    assert code == 0, data["findings"]
    assert data["nvrx"] == "0.4.1"
    assert data["source"].startswith(f"{out} (ConfigMap my-training-policy-")

    # The image is changed to NVRx 0.7.0 and the annotation with it, the policy is not.
    text = out.read_text(encoding="utf-8").replace(f"{NVRX_ANNOTATION}: 0.4.1", f"{NVRX_ANNOTATION}: 0.7.0")
    out.write_text(text, encoding="utf-8")
    code, data = validate_json("--manifest", str(out))
    assert code == 2 and data["nvrx"] == "0.7.0"
    [error] = [f for f in data["findings"] if f["severity"] == "error"]
    assert (error["table"], error["key"], error["value"]) == ("restart.in_job", "policy", '"min-healthy"')


def test_the_flag_wins_over_the_annotation_with_a_warning(tmp_path: Path) -> None:
    _, out = manifest(tmp_path, STARTER, "--nvrx", "0.7.0")
    code, data = validate_json("--manifest", str(out), "--nvrx", "0.6.0", "--strict")
    assert code == 1 and data["nvrx"] == "0.6.0"
    [warning] = [f for f in data["findings"] if f["severity"] == "warning"]
    assert (warning["code"], warning["value"], warning["file"]) == ("manifest-nvrx", '"0.7.0"', str(out))
    assert warning["key"] == f'spec.template.metadata.annotations["{NVRX_ANNOTATION}"]'
    assert "--nvrx 0.7.0" in warning["fix"]
    code, data = validate_json("--manifest", str(out), "--nvrx", "0.7.0", "--strict")
    assert code == 0, data["findings"]


def test_an_annotation_that_is_not_a_version_is_an_error(tmp_path: Path) -> None:
    _, out = manifest(tmp_path, STARTER, "--nvrx", "0.7.0")
    text = out.read_text(encoding="utf-8").replace(f"{NVRX_ANNOTATION}: 0.7.0", f"{NVRX_ANNOTATION}: newest")
    out.write_text(text, encoding="utf-8")
    code, data = validate_json("--manifest", str(out), "--nvrx", "0.7.0")
    assert code == 2
    [error] = [f for f in data["findings"] if f["severity"] == "error"]
    assert (error["code"], error["value"]) == ("manifest-nvrx", '"newest"')
    assert "--nvrx VERSION" in error["fix"]
    line = out.read_text(encoding="utf-8").splitlines()[error["line"] - 1]
    assert line.strip() == f"{NVRX_ANNOTATION}: newest"


def test_a_policy_file_is_still_checked_for_the_recorded_version(tmp_path: Path) -> None:
    _, out = manifest(tmp_path, MIN_HEALTHY, "--nvrx", "0.4.1")
    code, data = validate_json(str(tmp_path / "policy.toml"), "--manifest", str(out), "--strict")
    assert code == 0 and data["nvrx"] == "0.4.1" and data["source"] == str(tmp_path / "policy.toml")


# -- nvtrain init: one source of truth for the version -----------------------------------------


def test_init_prints_the_dockerfiles_version_in_both_steps(tmp_path: Path) -> None:
    pinned = re.search(r"^ARG NVRX_VERSION=(\S+)$", starter_text("Dockerfile"), re.MULTILINE)
    assert pinned is not None and starter_nvrx_version() == pinned.group(1)
    result = invoke("init", str(tmp_path / "proj"))
    assert result.exit_code == 0, result.output
    steps = result.stdout.replace("\n", " ")
    assert f"nvtrain validate {tmp_path / 'proj' / 'policy.toml'} --nvrx {pinned.group(1)}" in steps
    assert f"--nvrx {pinned.group(1)} -o job.yaml" in steps

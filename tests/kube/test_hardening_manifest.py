"""Reliability review: ``nvtrain manifest`` never renders what Kubernetes refuses or what could not
work, never overwrites its policy, and ``validate --manifest`` survives any YAML."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from templates_helpers import MINIMAL, policy_of
from typer.testing import CliRunner, Result

from nvtrain.cli import app
from nvtrain.errors import ConfigError, UsageError
from nvtrain.kube.manifest import manifest_from_file, render
from nvtrain.kube.options import ManifestOptions

runner = CliRunner()
CONFIGMAP_LIMIT = 1024 * 1024  # Kubernetes: the data of a ConfigMap is at most 1 MiB


def manifest(*args: str) -> Result:
    return runner.invoke(app, ["manifest", *args])


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("extra", "code", "where"),
    [
        ("stop_timeout = 1e300\n", "duration-limit", "[job] stop_timeout"),
        ("nproc_per_node = 9223372036854775807\n", "size-limit", "[job] nproc_per_node"),
        (f"[rendezvous]\nnodes = {2**63 - 1}\n", "size-limit", "[rendezvous] nodes"),
        ('args = ["a\\u0000"]\n', "job-args", "[job] args"),
    ],
)
def test_absurd_policy_values_render_nothing(tmp_path: Path, extra: str, code: str, where: str) -> None:
    """Before: a grace period of 301 digits, completions of 2**63-1, a NUL in the command."""
    path = write(tmp_path, MINIMAL + extra)
    with pytest.raises(ConfigError) as caught:
        manifest_from_file(path)
    assert [(f.code, f.where) for f in caught.value.findings if f.severity == "error"] == [(code, where)]
    result = manifest(str(path))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert where in result.stderr


def test_the_longest_durations_render_an_int64_grace_period(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + 'stop_timeout = "365d"\n[rendezvous]\nnodes = 100000\n')
    objects = manifest_from_file(path).objects
    job = objects[-1]
    assert job["spec"]["completions"] == 100000
    grace = job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == 365 * 86400 + 30 < 2**63


def test_a_policy_larger_than_a_configmap_is_refused(tmp_path: Path) -> None:
    big = MINIMAL + "# " + "x" * (2_100_000) + "\n"
    with pytest.raises(UsageError, match=r"more than a ConfigMap holds \(Kubernetes' limit is 1 MiB"):
        render(policy_of(MINIMAL), big)
    path = write(tmp_path, big)
    result = manifest(str(path))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert f"the policy file {path} is {len(big.encode()):,} bytes, more than a ConfigMap" in result.stderr


def test_a_policy_of_exactly_one_mib_renders() -> None:
    text = MINIMAL + "#" * (CONFIGMAP_LIMIT - len(MINIMAL) - 1) + "\n"
    assert len(text.encode()) == CONFIGMAP_LIMIT
    objects = render(policy_of(text), text)
    assert objects[0]["data"]["policy.toml"] == text


@pytest.mark.parametrize("directory", ["/ck:rw", "/checkpoints/a:b"])
def test_a_colon_in_the_checkpoint_dir_is_refused(directory: str) -> None:
    policy = policy_of(MINIMAL + f'[checkpoint]\ndir = "{directory}"\n')
    with pytest.raises(UsageError) as caught:
        render(policy, MINIMAL)
    assert "contains ':'" in caught.value.message and "mountPath" in caught.value.message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backoff-limit", str(2**31)], "--backoff-limit 2147483648 is too large"),
        (["--efa", str(2**40)], "--efa 1099511627776 is too large"),
        (["--gpus", "100000"], "--gpus 100000 is more GPUs than a pod can have"),
    ],
)
def test_absurd_counts_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    path = write(tmp_path, MINIMAL + 'nproc_per_node = "gpu"\n')
    result = manifest(str(path), *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_output_onto_the_policy_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    link = tmp_path / "link.toml"
    link.symlink_to(path)
    hard = tmp_path / "hard.toml"
    os.link(path, hard)
    for output in (path, link, hard, tmp_path / "." / "p.toml"):
        result = manifest(str(path), "-o", str(output))
        assert result.exit_code == 2, output
        assert result.stderr.splitlines() == [
            f"nvtrain: error: --output {output} is the policy file ({path}): writing it would "
            "overwrite what is being read",
            "  fix: give --output another file",
        ]
    assert path.read_text(encoding="utf-8") == MINIMAL
    assert manifest(str(path), "-o", str(tmp_path / "job.yaml")).exit_code == 0


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 100_000 + "]" * 100_000 + "\n",
        "a: " + "{x: " * 100_000 + "1" + "}" * 100_000 + "\n",
        "- " * 5000 + "x\n",
    ],
    ids=["flow-sequences", "flow-mappings", "block-sequences"],
)
def test_deeply_nested_yaml_is_a_finding(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text, "job.yaml")
    result = runner.invoke(app, ["validate", "--manifest", str(path), "--nvrx", "0.4.1"])
    assert result.exit_code == 2
    assert f"  {path}: error (top level)" in result.stderr
    assert "cannot be read: its YAML is nested too deeply" in result.stderr


def test_many_aliases_in_yaml_stay_cheap(tmp_path: Path) -> None:
    """A "billion laughs" document is not expanded when a finding shows its value."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]
    text = "---\n- " + "\n  ".join(lines) + "\n"
    path = write(tmp_path, text, "job.yaml")
    assert yaml.safe_load(text)  # valid YAML
    result = runner.invoke(app, ["validate", "--manifest", str(path), "--nvrx", "0.4.1"])
    assert result.exit_code == 2
    assert "is not a Kubernetes object" in result.stderr


def test_options_still_render(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "nproc_per_node = 8\n")
    objects = manifest_from_file(path, ManifestOptions(backoff_limit=2**31 - 1, gpus_per_node=8)).objects
    assert objects[-1]["spec"]["backoffLimit"] == 2**31 - 1

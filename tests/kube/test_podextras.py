"""The training pods' extras (``nvtrain.kube.podextras``): Secrets as environment, extra
volumes, init containers, affinity and topology, declared once and the same in the Job, the
JobSet and the Trainer runtime; bad values exit 2 naming the option and the fix."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from templates_helpers import KUBERNETES_VERSIONS, load_all, object_errors, policy_of, starter_named
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.errors import UsageError
from nvtrain.kube import podextras
from nvtrain.kube.manifest import render
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.yaml_io import dump

runner = CliRunner()

TEXT = starter_named("llm-workers-0")
"""The starter (2 pods of 8 ranks) named so that it renders as a JobSet too."""

EXTRAS = ManifestOptions(
    secret_env=("hub-token", "s3-credentials"),
    volumes=("pvc:datasets:/data:ro", "secret:hub-ca:/etc/hub-ca", "configmap:tokenizer:/opt/tokenizer"),
    init_containers=(
        {"name": "stage-data", "image": "busybox:1.36", "command": ["sh", "-c", "true"]},
        {"name": "warm-cache", "image": "busybox:1.36"},
    ),
    affinity={
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"team": "other"}},
                    },
                }
            ]
        }
    },
    required_topology="cloud.example.com/block",
)

SHAPES = {
    "job": {},
    "jobset": {"jobset": True, "exclusive_topology": "cloud.example.com/rack"},
    "runtime": {"trainer_runtime": "cluster", "exclusive_topology": "cloud.example.com/rack"},
}


def training_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The training pod template, whatever wraps it."""
    for obj in objects:
        if obj["kind"] == "Job":
            return obj["spec"]["template"]  # type: ignore[no-any-return]
        if obj["kind"] == "JobSet":
            return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]  # type: ignore[no-any-return]
        if obj["kind"] == "ClusterTrainingRuntime":
            jobs = obj["spec"]["template"]["spec"]["replicatedJobs"]
            return jobs[0]["template"]["spec"]["template"]  # type: ignore[no-any-return]
    raise AssertionError("no training pod")


def render_shape(shape: str, options: ManifestOptions = EXTRAS) -> list[dict[str, Any]]:
    return render(policy_of(TEXT), TEXT, dataclasses.replace(options, **SHAPES[shape]))


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_extras_are_the_same_in_every_shape(shape: str) -> None:
    pod = training_pod(render_shape(shape))
    spec = pod["spec"]
    container = spec["containers"][0]
    assert container["envFrom"] == [
        {"secretRef": {"name": "hub-token"}},
        {"secretRef": {"name": "s3-credentials"}},
    ]
    extra = {m["mountPath"]: m for m in container["volumeMounts"] if m["name"].startswith("extra-")}
    assert {p: (m["name"], m.get("readOnly")) for p, m in extra.items()} == {
        "/data": ("extra-0", True),
        "/etc/hub-ca": ("extra-1", True),
        "/opt/tokenizer": ("extra-2", True),
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["extra-0"]["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
    assert volumes["extra-1"]["secret"] == {"secretName": "hub-ca"}
    assert volumes["extra-2"]["configMap"] == {"name": "tokenizer"}
    assert [c["name"] for c in spec["initContainers"]] == ["stage-data", "warm-cache"]
    assert spec["affinity"] == EXTRAS.affinity
    assert pod["metadata"]["annotations"][podextras.REQUIRED_TOPOLOGY] == "cloud.example.com/block"
    # The control pod and nvtrain's own mounts are untouched.
    assert [m["name"] for m in container["volumeMounts"][:3]] == ["policy", "checkpoints", "dshm"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_with_the_extras_is_valid(shape: str, version: str) -> None:
    objects = load_all(dump(render_shape(shape)))
    errors = [e for o in objects for e in object_errors(o, version)]
    assert not errors, "\n".join(errors)


def test_exclusive_topology_is_an_annotation_of_the_jobset() -> None:
    [jobset] = [o for o in render_shape("jobset") if o["kind"] == "JobSet"]
    assert jobset["metadata"]["annotations"] == {podextras.EXCLUSIVE_TOPOLOGY: "cloud.example.com/rack"}


def test_preferred_topology() -> None:
    options = dataclasses.replace(
        EXTRAS, required_topology=None, preferred_topology="cloud.example.com/block"
    )
    annotations = training_pod(render_shape("job", options))["metadata"]["annotations"]
    assert annotations[podextras.PREFERRED_TOPOLOGY] == "cloud.example.com/block"
    assert podextras.REQUIRED_TOPOLOGY not in annotations


def test_the_extras_do_not_reach_the_control_pod() -> None:
    from templates_helpers import with_control_store

    text = with_control_store(TEXT)
    objects = render(policy_of(text), text, EXTRAS)
    [control] = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].endswith("-control")]
    spec = control["spec"]["template"]["spec"]
    assert "initContainers" not in spec and "affinity" not in spec
    assert "envFrom" not in spec["containers"][0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"volumes": ("nfs:data:/data",)}, "'nfs' is not a volume kind"),
        ({"volumes": ("pvc:data",)}, "is not KIND:NAME:PATH[:ro]"),
        ({"volumes": ("pvc:data:/data:rw",)}, "is not KIND:NAME:PATH[:ro]"),
        ({"volumes": ("pvc:Data:/data",)}, "is not a PersistentVolumeClaim name"),
        ({"volumes": ("pvc:data:data",)}, "is not an absolute, normalized path"),
        (
            {"volumes": ("pvc:data:/etc/nvtrain/extra",)},
            "overlaps /etc/nvtrain, where nvtrain mounts the policy",
        ),
        ({"volumes": ("pvc:data:/",)}, "overlaps"),
        ({"volumes": ("pvc:data:/checkpoints",)}, "the checkpoint volume"),
        ({"volumes": ("pvc:a:/data", "pvc:b:/data")}, "is mounted where --volume pvc:a already is"),
        ({"secret_env": ("Hub_Token",)}, "--secret-env 'Hub_Token' is not a Secret name"),
        ({"secret_env": ("a", "a")}, "--secret-env a is given twice"),
        ({"init_containers": ({"image": "x"},)}, "has no name"),
        ({"init_containers": ({"name": "trainer", "image": "x"},)}, "is taken by another container"),
        ({"init_containers": ({"name": "a"},)}, "'a' has no image"),
        ({"init_containers": ("echo",)}, "is not a mapping"),
        ({"affinity": {"nodeSelector": {}}}, "'nodeSelector', which is not one of"),
        ({"affinity": []}, "--affinity is not a mapping"),
        ({"exclusive_topology": "rack"}, "is an annotation of the JobSet"),
        ({"preferred_topology": "rack"}, "are both given"),
        ({"required_topology": "bad key!"}, "--required-topology key 'bad key!' is not valid"),
        ({"annotations": {podextras.REQUIRED_TOPOLOGY: "rack"}}, podextras.REQUIRED_TOPOLOGY),
    ],
)
def test_bad_extras_are_refused_with_a_fix(change: dict[str, Any], message: str) -> None:
    options = dataclasses.replace(EXTRAS, **change)
    with pytest.raises(UsageError) as caught:
        render(policy_of(TEXT), TEXT, options)
    assert message in str(caught.value), str(caught.value)
    assert caught.value.fix


def test_the_cli_reads_the_yaml_files(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(TEXT, encoding="utf-8")
    one = tmp_path / "one.yaml"
    one.write_text("name: stage-data\nimage: busybox:1.36\n", encoding="utf-8")
    two = tmp_path / "two.yaml"
    two.write_text("- name: a\n  image: busybox:1.36\n- name: b\n  image: busybox:1.36\n", encoding="utf-8")
    affinity = tmp_path / "affinity.yaml"
    affinity.write_text("nodeAffinity: {}\n", encoding="utf-8")
    args = ["manifest", str(policy), f"--init-container={one}", f"--init-container={two}"]
    result = runner.invoke(app, [*args, f"--affinity={affinity}", "--secret-env=hub-token"])
    assert result.exit_code == 0, result.output
    spec = training_pod(load_all(result.stdout))["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["stage-data", "a", "b"]
    assert spec["affinity"] == {"nodeAffinity": {}}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"name: [unclosed\n", "is not UTF-8 YAML (line 2)"),
        (b"\xff\xfe", "is not UTF-8 YAML"),
        (None, "cannot read it"),
    ],
)
def test_a_bad_yaml_file_exits_2_naming_it(tmp_path: Path, content: bytes | None, message: str) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(TEXT, encoding="utf-8")
    init = tmp_path / "init.yaml"
    if content is not None:
        init.write_bytes(content)
    result = runner.invoke(app, ["manifest", str(policy), f"--init-container={init}"])
    assert result.exit_code == 2, result.output
    assert f"--init-container {init}" in result.stderr and message in result.stderr
    assert "fix:" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize("shape", ["job", "jobset"])
def test_validate_manifest_finds_nothing_wrong_with_the_extras(tmp_path: Path, shape: str) -> None:
    """The extras break none of the references that ``validate --manifest`` checks (the
    checkpoint mount, the volumes, the container, the command, ...)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(TEXT, encoding="utf-8")
    manifest = tmp_path / "job.yaml"
    manifest.write_text(dump(render_shape(shape)), encoding="utf-8")
    result = runner.invoke(app, ["validate", str(policy), "--manifest", str(manifest), "--strict", "--json"])
    assert result.exit_code == 0, result.output

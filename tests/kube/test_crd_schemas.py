"""The upstream CRDs of ``crds/``: pinned (a changed file is refused), documented in
``crds/README.md``, and covering every custom resource kind that ``nvtrain manifest`` renders."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
from crd_schemas import CRDS, PINNED, SCHEMAS, crd_file, crd_schema
from templates_helpers import policy_of, set_keys, starter_named, with_control_store

from nvtrain.kube.manifest import render
from nvtrain.kube.options import ManifestOptions

BUILT_IN = {"ConfigMap", "Service", "NetworkPolicy", "Job"}


@pytest.mark.parametrize("kind", sorted(PINNED))
def test_every_pinned_crd_is_the_upstream_file_and_documented(kind: str) -> None:
    crd = crd_file(kind)
    assert crd["spec"]["names"]["kind"] == kind
    name, digest = PINNED[kind]
    readme = (CRDS / "README.md").read_text(encoding="utf-8")
    [row] = [line for line in readme.splitlines() if line.startswith(f"| `{name}` |")]
    assert digest in row  # the README names the release, the commit and this SHA-256


def test_a_changed_crd_file_is_refused(tmp_path: Path) -> None:
    name, _ = PINNED["PodGroup"]
    shutil.copy(CRDS / name, tmp_path / name)
    crd_file("PodGroup", tmp_path)  # the copy is the pinned file
    text = gzip.decompress((tmp_path / name).read_bytes()).replace(b"minMember", b"minMembers")
    (tmp_path / name).write_bytes(gzip.compress(text))
    with pytest.raises(AssertionError, match="is not the pinned upstream file"):
        crd_file.__wrapped__("PodGroup", tmp_path)


def test_the_schema_is_strict_where_the_api_server_is() -> None:
    """An object that declares its fields takes no other (``kubectl apply`` refuses them); one
    with ``x-kubernetes-preserve-unknown-fields`` or a map of values keeps taking them."""
    schema = crd_schema("PodGroup", "scheduling.volcano.sh/v1beta1")
    assert schema is not None
    assert schema["properties"]["spec"]["additionalProperties"] is False
    assert crd_schema("PodGroup", "scheduling.volcano.sh/v1alpha1") is None  # not served


def test_every_custom_resource_nvtrain_renders_has_a_pinned_crd() -> None:
    text = with_control_store(starter_named("llm-workers-0"))
    kinds: set[str] = set()
    metrics = set_keys(text, {("metrics", "enabled"): "true"})
    for options in (
        ManifestOptions(jobset=True, pod_monitor=True),
        ManifestOptions(scheduler_name="volcano", queue="research", pod_monitor=True),
    ):
        kinds |= {o["kind"] for o in render(policy_of(metrics), metrics, options)}
    plain = starter_named("llm-train")
    for scope in ("cluster", "namespaced"):
        kinds |= {o["kind"] for o in render(policy_of(plain), plain, ManifestOptions(trainer_runtime=scope))}
    assert kinds - BUILT_IN <= SCHEMAS, kinds - BUILT_IN - SCHEMAS
    assert {"JobSet", "PodGroup", "PodMonitor", "ClusterTrainingRuntime", "TrainingRuntime"} <= kinds

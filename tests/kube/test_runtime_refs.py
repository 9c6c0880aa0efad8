"""``nvtrain validate --manifest`` on a Kubeflow Trainer runtime (``nvtrain manifest
--trainer-runtime``): the references its pods depend on, and what Trainer takes from it.

Each patch is one that Kubernetes and Trainer accept and that breaks the TrainJobs of the
runtime (or opens their pods); the rendered runtime passes with no finding, the patched one
has exactly the finding named.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from templates_helpers import MINIMAL, policy_of, set_keys, starter_two_nodes, with_control_store
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.findings import Finding
from nvtrain.kube.manifest import render
from nvtrain.kube.manifest_checks import check_manifest
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.trainer_runtime import ANCESTOR_LABEL

STARTER = starter_two_nodes()
METRICS = (
    MINIMAL + 'nproc_per_node = 8\n[rendezvous]\nnodes = 4\nnamespace = "team-a"\n[metrics]\nenabled = true\n'
)
ROOT = "spec.template.spec"
JOB = f"{ROOT}.replicatedJobs[0].template.spec"
POD = f"{JOB}.template.spec"
NODE = f"{POD}.containers[0]"
TABLE = "ClusterTrainingRuntime llm-train"

Doc = dict[str, Any]
runner = CliRunner()


def rendered(text: str = METRICS, **options: Any) -> list[Doc]:
    options.setdefault("trainer_runtime", "cluster")
    return render(policy_of(text), text, ManifestOptions(**options))


def findings(tmp_path: Path, docs: list[Doc], text: str = METRICS) -> list[Finding]:
    path = tmp_path / "runtime.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    return check_manifest(path, policy_of(text), policy_text=text)


def runtime(docs: list[Doc]) -> Doc:
    return docs[-1]


def job(docs: list[Doc]) -> Doc:
    return runtime(docs)["spec"]["template"]["spec"]["replicatedJobs"][0]  # type: ignore[no-any-return]


def pod(docs: list[Doc]) -> Doc:
    return job(docs)["template"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def node(docs: list[Doc]) -> Doc:
    return pod(docs)["containers"][0]  # type: ignore[no-any-return]


def of_kind(docs: list[Doc], kind: str) -> Doc:
    return next(d for d in docs if d["kind"] == kind)


# -- the patches ------------------------------------------------------------------------------


def configmap_ref(docs: list[Doc]) -> None:
    pod(docs)["volumes"][0]["configMap"]["name"] = "llm-train-policy-old"


def relabel_pods(docs: list[Doc]) -> None:
    job(docs)["template"]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"] = "x"


def narrow_network_policy(docs: list[Doc]) -> None:
    of_kind(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]["team"] = "a"


def narrow_pod_monitor(docs: list[Doc]) -> None:
    of_kind(docs, "PodMonitor")["spec"]["selector"]["matchLabels"]["team"] = "a"


def rename_container(docs: list[Doc]) -> None:
    node(docs)["name"] = "main"


def other_command(docs: list[Doc]) -> None:
    node(docs)["command"] = ["torchrun", "--nproc-per-node=8", "train.py"]


def other_policy_path(docs: list[Doc]) -> None:
    node(docs)["command"] = ["nvtrain", "run", "/workspace/policy.toml"]


def move_checkpoint_mount(docs: list[Doc]) -> None:
    node(docs)["volumeMounts"][1]["mountPath"] = "/mnt/elsewhere"


def drop_shm(docs: list[Doc]) -> None:
    node(docs)["volumeMounts"].pop(2)
    pod(docs)["volumes"].pop(2)


def drop_failure_policy(docs: list[Doc]) -> None:
    del job(docs)["template"]["spec"]["podFailurePolicy"]


def drop_run_id(docs: list[Doc]) -> None:
    node(docs)["env"] = [e for e in node(docs)["env"] if e["name"] != "NVTRAIN_RUN_ID"]


def run_id_of_the_job(docs: list[Doc]) -> None:
    """The Job's UID, not the JobSet's: the replicated Job's pods share it, but a TrainJob whose
    JobSet recreates its Jobs (JobSet restarts) gets a new run id and resumes nothing."""
    [entry] = [e for e in node(docs)["env"] if e["name"] == "NVTRAIN_RUN_ID"]
    entry["valueFrom"]["fieldRef"]["fieldPath"] = "metadata.labels['batch.kubernetes.io/controller-uid']"


def fewer_gpus(docs: list[Doc]) -> None:
    for key in ("requests", "limits"):
        node(docs)["resources"][key]["nvidia.com/gpu"] = 4


def other_node_count(docs: list[Doc]) -> None:
    runtime(docs)["spec"]["mlPolicy"]["numNodes"] = 2


def torch_policy(docs: list[Doc]) -> None:
    runtime(docs)["spec"]["mlPolicy"]["torch"] = {"numProcPerNode": 8}


def fixed_subdomain(docs: list[Doc]) -> None:
    runtime(docs)["spec"]["template"]["spec"]["network"]["subdomain"] = "llm-train"


def drop_ancestor_label(docs: list[Doc]) -> None:
    del job(docs)["template"]["metadata"]["labels"][ANCESTOR_LABEL]


Expected = set[tuple[str, str, str, str]]
PATCHES: list[tuple[Callable[[list[Doc]], None], Expected]] = [
    (configmap_ref, {("error", "manifest-configmap", TABLE, f"{POD}.volumes[0].configMap.name")}),
    (
        relabel_pods,
        {
            ("error", "manifest-selector", "NetworkPolicy llm-train-peers", "spec.podSelector"),
            ("warning", "manifest-selector", "PodMonitor llm-train", "spec.selector"),
        },
    ),
    (
        narrow_network_policy,
        {("error", "manifest-selector", "NetworkPolicy llm-train-peers", "spec.podSelector")},
    ),
    (narrow_pod_monitor, {("warning", "manifest-selector", "PodMonitor llm-train", "spec.selector")}),
    (
        rename_container,
        {
            (
                "error",
                "manifest-container",
                TABLE,
                f"{JOB}.podFailurePolicy.rules[0].onExitCodes.containerName",
            ),
            ("warning", "manifest-mismatch", TABLE, f"{NODE}.name"),
        },
    ),
    (other_command, {("warning", "manifest-command", TABLE, f"{NODE}.command")}),
    (other_policy_path, {("error", "manifest-command", TABLE, f"{NODE}.command")}),
    (move_checkpoint_mount, {("error", "manifest-mount", TABLE, f"{NODE}.volumeMounts")}),
    (drop_shm, {("warning", "manifest-mount", TABLE, f"{NODE}.volumeMounts")}),
    (drop_failure_policy, {("warning", "manifest-failure-policy", TABLE, f"{JOB}.podFailurePolicy")}),
    (drop_run_id, {("error", "manifest-run-id", TABLE, f"{NODE}.env")}),
    (run_id_of_the_job, {("warning", "manifest-run-id", TABLE, f"{NODE}.env[2]")}),
    (fewer_gpus, {("error", "manifest-gpus", TABLE, f'{NODE}.resources.limits["nvidia.com/gpu"]')}),
    (other_node_count, {("warning", "manifest-mismatch", TABLE, "spec.mlPolicy.numNodes")}),
    (torch_policy, {("warning", "manifest-mismatch", TABLE, "spec.mlPolicy.torch")}),
    (fixed_subdomain, {("warning", "manifest-mismatch", TABLE, f"{ROOT}.network.subdomain")}),
    (
        drop_ancestor_label,
        {("warning", "manifest-mismatch", TABLE, f"{ROOT}.replicatedJobs[0].template.metadata.labels")},
    ),
]


@pytest.mark.parametrize(
    ("patch", "expected"), PATCHES, ids=[p[0].__name__.replace("_", "-") for p in PATCHES]
)
def test_a_patch_that_breaks_the_runtime_is_found(
    tmp_path: Path, patch: Callable[[list[Doc]], None], expected: Expected
) -> None:
    docs = rendered(pod_monitor=True)
    assert findings(tmp_path, docs) == []
    patch(docs)
    found = findings(tmp_path, docs)
    assert {(f.severity, f.code, f.table, f.key) for f in found} == expected, [f.rule for f in found]
    for f in found:
        assert f.file == str(tmp_path / "runtime.yaml") and f.line is not None
        assert f.rule and f.fix


def test_the_run_id_finding_names_the_jobset_of_each_trainjob(tmp_path: Path) -> None:
    docs = rendered()
    drop_run_id(docs)
    [found] = findings(tmp_path, docs)
    assert "metadata.labels['jobset.sigs.k8s.io/jobset-uid']" in found.fix
    assert "--trainer-runtime" not in found.fix  # the fix names the field, the re-render is elsewhere
    docs = rendered()
    drop_failure_policy(docs)
    assert all("--trainer-runtime cluster" in f.fix for f in findings(tmp_path, docs))


def test_a_runtime_cannot_hold_the_control_store(tmp_path: Path) -> None:
    """The runtime of a pod0 policy checked against a control-store one: no pod would run the store."""
    text = with_control_store(STARTER)
    found = findings(tmp_path, rendered(STARTER), text)
    control = [f for f in found if f.key == f"{ROOT}.replicatedJobs"]
    assert [(f.severity, f.code) for f in control] == [("warning", "manifest-mismatch")]
    assert "a Trainer runtime does not hold" in control[0].rule
    assert 'store = "pod0"' in control[0].fix


@pytest.mark.parametrize("scope", ["cluster", "namespaced"])
def test_validate_checks_a_rendered_runtime(tmp_path: Path, scope: str) -> None:
    """With the policy, and without it (the policy in the runtime's ConfigMap)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(set_keys(STARTER, {("job", "backend"): '"nccl"'}), encoding="utf-8")
    manifest = tmp_path / "runtime.yaml"
    rendering = runner.invoke(
        app, ["manifest", str(policy), f"--trainer-runtime={scope}", "-o", str(manifest)]
    )
    assert rendering.exit_code == 0, rendering.output
    for args in ([str(policy)], []):
        result = runner.invoke(
            app, ["validate", *args, "--nvrx", "0.7.0", "--manifest", str(manifest), "--strict"]
        )
        assert result.exit_code == 0, result.output
        assert "is valid" in result.output
    docs = list(yaml.safe_load_all(manifest.read_text(encoding="utf-8")))
    fewer_gpus(docs)
    manifest.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    result = runner.invoke(app, ["validate", "--nvrx", "0.7.0", "--manifest", str(manifest), "--json"])
    assert result.exit_code == 2, result.output
    assert '"code": "manifest-gpus"' in result.output and "Traceback" not in result.output

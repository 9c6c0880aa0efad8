"""``nvtrain manifest --trainer-runtime``: a Kubeflow Trainer v2 runtime whose pods run
``nvtrain run``, checked against the pinned upstream Trainer CRDs (``crds/``), and the pods it
makes finding their peers from the names Trainer and JobSet give them."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from crd_schemas import crd_errors
from templates_helpers import (
    KUBERNETES_VERSIONS,
    MINIMAL,
    by_kind,
    check_golden,
    load_all,
    object_errors,
    policy_of,
    starter_two_nodes,
    with_control_store,
)
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.kube import podextras, trainer_runtime
from nvtrain.kube.manifest import render
from nvtrain.kube.objects import JOBSET_UID_LABEL, POLICY_FILE, POLICY_MOUNT
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.yaml_io import dump
from nvtrain.launcher.identity import pod_names

runner = CliRunner()

STARTER = starter_two_nodes()
"""8 ranks per pod, 2 pods."""
METRICS = (
    MINIMAL + 'nproc_per_node = 8\n[rendezvous]\nnodes = 4\nnamespace = "team-a"\n[metrics]\nenabled = true\n'
)

EXTRAS = ManifestOptions(
    trainer_runtime="cluster",
    image="registry.example.com/ml/llm:2",
    secret_env=("hub-token",),
    volumes=("pvc:datasets:/data:ro", "configmap:tokenizer:/etc/tokenizer"),
    init_containers=({"name": "stage-data", "image": "busybox:1.36", "command": ["true"]},),
    affinity={
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "gpu.example.com/model", "operator": "In", "values": ["h200"]}
                        ]
                    }
                ]
            }
        }
    },
    exclusive_topology="cloud.example.com/nvlink-domain",
    preferred_topology="cloud.example.com/block",
    tolerations=("dedicated=training:NoSchedule",),
    pod_security="restricted",
    ttl=600,
    pod_monitor=True,
)


def objects_of(text: str, options: ManifestOptions) -> list[dict[str, Any]]:
    return render(policy_of(text), text, options)


POD = ("spec", "template", "spec", "replicatedJobs", 0, "template", "spec", "template", "spec")
"""Path of the pod spec in the runtime."""


def replicated(runtime: dict[str, Any]) -> dict[str, Any]:
    [job] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return job  # type: ignore[no-any-return]


CASES = {
    "cluster": (STARTER, ManifestOptions(trainer_runtime="cluster")),
    "namespaced": (STARTER, ManifestOptions(trainer_runtime="namespaced")),
    "extras": (METRICS, EXTRAS),
    "namespaced-per-index": (STARTER, ManifestOptions(trainer_runtime="namespaced", kubernetes="1.33")),
}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_object_is_valid_against_its_schema(case: str, version: str) -> None:
    """The runtime against the Trainer v2.3.0 CRD (strict: no undeclared field), its replicated
    Job as a batch/v1 Job against Kubernetes' schema, the other objects by kubernetes-validate."""
    text, options = CASES[case]
    objects = load_all(dump(objects_of(text, options)))
    errors = [e for o in objects for e in object_errors(o, version)]
    assert not errors, "\n".join(errors)


def test_the_runtime_is_what_trainer_expects() -> None:
    text, options = CASES["cluster"]
    policy = policy_of(text)
    objects = objects_of(text, options)
    # JobSet makes the headless Service of each TrainJob: no Service of nvtrain's.
    assert [o["kind"] for o in objects] == ["ConfigMap", "NetworkPolicy", "ClusterTrainingRuntime"]
    runtime = by_kind(objects, "ClusterTrainingRuntime")
    assert runtime["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert "namespace" not in runtime["metadata"]  # cluster-scoped
    # No torch policy: nvtrain is the launcher; the PET_* variables are the container's own.
    assert runtime["spec"]["mlPolicy"] == {"numNodes": policy.rendezvous.nodes}
    # The Kubeflow SDK lists and uses only runtimes with this label (test_trainer_sdk.py).
    assert runtime["metadata"]["labels"][trainer_runtime.FRAMEWORK_LABEL] == "torch"
    job = replicated(runtime)
    assert job["name"] == "node" and job["replicas"] == 1
    assert job["template"]["metadata"]["labels"][trainer_runtime.ANCESTOR_LABEL] == "trainer"
    spec = job["template"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    # Trainer applies a TrainJob's image, env and resourcesPerNode to the container named node.
    assert container["name"] == "node"
    assert container["command"] == ["nvtrain", "run", f"{POLICY_MOUNT}/{POLICY_FILE}"]
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0]["onExitCodes"]["containerName"] == "node"
    assert rules[0]["onExitCodes"]["values"] == [2, 4]
    assert "subdomain" not in pod  # JobSet's: the TrainJob's name
    run_id = next(e for e in container["env"] if e["name"] == "NVTRAIN_RUN_ID")
    assert JOBSET_UID_LABEL in run_id["valueFrom"]["fieldRef"]["fieldPath"]
    configmap = by_kind(objects, "ConfigMap")
    assert pod["volumes"][0]["configMap"]["name"] == configmap["metadata"]["name"]
    assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 0


def test_the_namespaced_runtime_sits_beside_its_configmap() -> None:
    text, options = CASES["namespaced"]
    objects = objects_of(text, options)
    runtime = by_kind(objects, "TrainingRuntime")
    assert runtime["metadata"]["namespace"] == by_kind(objects, "ConfigMap")["metadata"]["namespace"]


def test_the_extras_reach_the_runtime() -> None:
    text, options = CASES["extras"]
    objects = objects_of(text, options)
    runtime = by_kind(objects, "ClusterTrainingRuntime")
    template = runtime["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        podextras.EXCLUSIVE_TOPOLOGY: "cloud.example.com/nvlink-domain"
    }
    assert template["spec"]["ttlSecondsAfterFinished"] == 600
    pod = replicated(runtime)["template"]["spec"]["template"]
    assert pod["metadata"]["annotations"][podextras.PREFERRED_TOPOLOGY] == "cloud.example.com/block"
    [container] = pod["spec"]["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": "hub-token"}}]
    [init] = pod["spec"]["initContainers"]
    assert init["securityContext"] == container["securityContext"]  # restricted, as the trainer
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["spec"]["affinity"] == EXTRAS.affinity
    assert [o["kind"] for o in objects] == [
        "ConfigMap",
        "NetworkPolicy",
        "PodMonitor",
        "ClusterTrainingRuntime",
    ]


def test_the_crd_schema_catches_a_broken_runtime() -> None:
    """The check is real: the upstream schema refuses each of these."""
    text, options = CASES["cluster"]
    runtime = by_kind(objects_of(text, options), "ClusterTrainingRuntime")
    assert crd_errors(runtime) == []
    for path, value in (
        (("spec", "mlPolicy", "numNodes"), "2"),
        (("spec", "mlPolicy", "launcher"), "nvtrain"),
        (("spec", "template", "spec", "replicatedJobs", 0, "replicas"), "one"),
        (("spec", "template", "spec", "network", "subdomain"), 7),
        (("spec", "template", "spec", "failurePolicy", "rules", 0, "action"), "Retry"),
        ((*POD, "hostNetwrk"), True),
        ((*POD, "containers", 0, "resources", "limits", "memory"), "lots"),
        (("apiVersion",), "trainer.kubeflow.org/v1"),
    ):
        broken: Any = copy.deepcopy(runtime)
        target = broken
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        assert crd_errors(broken), path


def test_a_trainjob_pod_finds_pod_0_from_its_own_names(tmp_path: Path) -> None:
    """Pod 2 of the TrainJob ``<job>-exp1`` (namespace team-a) is ``<job>-exp1-node-0-2`` under
    the JobSet's Service ``<job>-exp1``: nvtrain dials ``<job>-exp1-node-0-0`` there, not the
    policy's ``<job>-0.<service>.default``."""
    policy = policy_of(STARTER)
    job = policy.job.name
    hosts = tmp_path / "hosts"
    host = f"{job}-exp1-node-0-2"
    hosts.write_text(f"10.0.0.7\t{host}.{job}-exp1.team-a.svc.cluster.local\t{host}\n", encoding="utf-8")
    names = pod_names(policy, {}, hostname=host, rank=2, hosts_file=hosts)
    assert names.pod(0) == f"{job}-exp1-node-0-0.{job}-exp1.team-a.svc.cluster.local"
    # A TrainJob whose name does not hold [job] name is not recognised: the policy's names.
    other = pod_names(policy, {}, hostname="exp1-node-0-2", rank=2, hosts_file=hosts)
    assert other.pod(0) == f"{job}-0.{policy.service}.default.svc.cluster.local"


def test_golden_trainer_runtime() -> None:
    text, options = CASES["extras"]
    check_golden("trainer_runtime.yaml", dump(objects_of(text, options)))


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        (STARTER, ["--trainer-runtime", "global"], "--trainer-runtime 'global' is not a runtime scope"),
        (
            STARTER,
            ["--trainer-runtime", "cluster", "--jobset"],
            "--trainer-runtime and --jobset are both given",
        ),
        (with_control_store(STARTER), ["--trainer-runtime", "cluster"], 'store = "control"'),
        (STARTER, ["--trainer-runtime", "cluster", "--scheduler-name", "volcano"], "podGroupPolicy"),
        (STARTER, ["--trainer-runtime", "cluster", "--queue", "team-a"], "label each TrainJob"),
    ],
)
def test_what_a_runtime_cannot_hold_exits_2_with_a_fix(
    tmp_path: Path, text: str, args: list[str], message: str
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(text, encoding="utf-8")
    result = runner.invoke(app, ["manifest", str(policy), *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "fix:" in result.stderr
    assert result.stdout == "" and "Traceback" not in result.output


def test_the_cli_renders_the_runtime(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(METRICS, encoding="utf-8")
    init = tmp_path / "init.yaml"
    init.write_text("name: stage-data\nimage: busybox:1.36\ncommand: ['true']\n", encoding="utf-8")
    affinity = tmp_path / "affinity.yaml"
    affinity.write_text(dump([dict(EXTRAS.affinity or {})]).split("---\n", 1)[1], encoding="utf-8")
    result = runner.invoke(
        app,
        [
            "manifest",
            str(policy),
            "--trainer-runtime=cluster",
            "--image=registry.example.com/ml/llm:2",
            "--secret-env=hub-token",
            "--volume=pvc:datasets:/data:ro",
            "--volume=configmap:tokenizer:/etc/tokenizer",
            f"--init-container={init}",
            f"--affinity={affinity}",
            "--exclusive-topology=cloud.example.com/nvlink-domain",
            "--preferred-topology=cloud.example.com/block",
            "--toleration=dedicated=training:NoSchedule",
            "--pod-security=restricted",
            "--ttl=600",
            "--pod-monitor",
        ],
    )
    assert result.exit_code == 0, result.output
    assert load_all(result.stdout) == load_all(dump(objects_of(METRICS, dataclasses.replace(EXTRAS))))

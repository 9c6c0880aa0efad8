"""``nvtrain.kube.manifest``: what each object holds, that it comes from the policy, golden
files, and the Kubernetes OpenAPI schemas (1.28 and the newest that kubernetes-validate ships)."""

from __future__ import annotations

import copy
import dataclasses
import json
import socket
from typing import Any

import pytest
from kubernetes_validate import utils as kv
from templates_helpers import (
    CONTROL,
    KUBERNETES_VERSIONS,
    MINIMAL,
    OLDEST,
    by_kind,
    check_golden,
    load_all,
    object_errors,
    policy_of,
    schema_errors,
    set_keys,
    starter_named,
    starter_two_nodes,
    with_control_store,
)

from nvtrain.errors import UsageError
from nvtrain.kube.init import starter_text
from nvtrain.kube.manifest import render
from nvtrain.kube.objects import CONTAINER, CONTROL_RESOURCES, GRACE_MARGIN, grace_period
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.sizing import (
    host_copies_per_rank,
    host_copy_bytes,
    keeps_host_copy,
    notes,
    ranks_per_pod,
    sends_peer_copy,
)
from nvtrain.kube.yaml_io import dump
from nvtrain.kubenames import control_name

P5 = ManifestOptions(
    image="registry.example.com/ml/llm-train@sha256:" + "0" * 64,
    efa=32,
    cpu="90",
    memory="900Gi",
    shm_size="64Gi",
    checkpoint_pvc="fsx-checkpoint-pvc",
    backoff_limit=10,
    labels={"team": "ml", "example.com/cost-center": "research"},
    env={"FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_DEBUG": "WARN"},
    node_selector={"node.kubernetes.io/instance-type": "p5.48xlarge"},
)


def objects_of(text: str, options: ManifestOptions | None = None) -> list[dict[str, Any]]:
    return render(policy_of(text), text, options)


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    job = by_kind(objects, "Job")
    return job["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [only] = pod_spec(objects)["containers"]
    return only  # type: ignore[no-any-return]


def env_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(objects)["env"]}


# -- what the objects hold ---------------------------------------------------------------------


def test_objects_in_apply_order() -> None:
    kinds = [o["kind"] for o in objects_of(MINIMAL)]
    assert kinds == ["ConfigMap", "Service", "NetworkPolicy", "Job"]


def test_job_is_indexed_with_one_pod_per_node() -> None:
    text = set_keys(starter_text("policy.toml"), {("rendezvous", "nodes"): "16"})
    spec = by_kind(objects_of(text), "Job")["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 16
    assert spec["template"]["spec"]["restartPolicy"] == "Never"


def test_pod_failure_policy_never_retries_2_and_4_and_ignores_disruptions() -> None:
    objects = objects_of(MINIMAL, ManifestOptions(backoff_limit=9))
    spec = by_kind(objects, "Job")["spec"]
    assert spec["backoffLimit"] == 9
    fail, ignore = spec["podFailurePolicy"]["rules"]
    assert fail["action"] == "FailJob"
    assert fail["onExitCodes"] == {"containerName": CONTAINER, "operator": "In", "values": [2, 4]}
    assert fail["onPodConditions"] == []  # the 1.28 schema requires the key; empty means unused
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert container(objects)["name"] == CONTAINER


def test_pod_identity_comes_from_kubernetes() -> None:
    env = env_of(objects_of(MINIMAL))
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["JOB_COMPLETION_INDEX"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert env["NVTRAIN_RUN_ID"] == {
        "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}
    }


def test_names_namespace_port_and_service_come_from_the_policy() -> None:
    text = MINIMAL + '[rendezvous]\nservice = "peers"\nnamespace = "team-a"\nport = 31000\nnodes = 3\n'
    objects = objects_of(text)
    assert {o["metadata"]["namespace"] for o in objects} == {"team-a"}
    service = by_kind(objects, "Service")
    assert service["metadata"]["name"] == "peers"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"] == [
        {"name": "rendezvous", "port": 31000, "targetPort": 31000, "protocol": "TCP"}
    ]
    spec = pod_spec(objects)
    assert spec["subdomain"] == "peers"
    assert by_kind(objects, "Job")["metadata"]["name"] == "llm-train"
    assert container(objects)["ports"] == [{"name": "rendezvous", "containerPort": 31000, "protocol": "TCP"}]


def test_service_selects_exactly_the_pods_of_the_job() -> None:
    objects = objects_of(MINIMAL, ManifestOptions(labels={"team": "ml"}))
    selector = by_kind(objects, "Service")["spec"]["selector"]
    pod_labels = by_kind(objects, "Job")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert selector["app.kubernetes.io/instance"] == "llm-train"
    assert pod_labels["team"] == "ml"


def test_network_policy_admits_only_the_jobs_own_pods_on_every_port() -> None:
    objects = objects_of(MINIMAL)
    spec = by_kind(objects, "NetworkPolicy")["spec"]
    selector = by_kind(objects, "Service")["spec"]["selector"]
    assert spec["podSelector"] == {"matchLabels": selector}
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]  # no "ports": all


METRICS_ON = MINIMAL + "\n[metrics]\nenabled = true\nport = 9400\n"


def test_metrics_port_is_declared_annotated_and_open_to_scrapers() -> None:
    objects = objects_of(METRICS_ON)
    ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
    assert ports["metrics"] == 9400
    template = by_kind(objects, "Job")["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9400",
        "prometheus.io/path": "/metrics",
    }
    ingress = by_kind(objects, "NetworkPolicy")["spec"]["ingress"]
    selector = by_kind(objects, "Service")["spec"]["selector"]
    # The job's own pods on every port, and anyone on the metrics port only.
    assert ingress == [
        {"from": [{"podSelector": {"matchLabels": selector}}]},
        {"ports": [{"protocol": "TCP", "port": 9400}]},
    ]
    off = objects_of(MINIMAL)
    assert "annotations" not in by_kind(off, "Job")["spec"]["template"]["metadata"]
    assert [p["name"] for p in container(off)["ports"]] == ["rendezvous"]


def test_policy_is_mounted_from_an_immutable_configmap_named_by_its_hash() -> None:
    objects = objects_of(MINIMAL)
    configmap = by_kind(objects, "ConfigMap")
    assert configmap["immutable"] is True
    assert configmap["data"] == {"policy.toml": MINIMAL}
    name = configmap["metadata"]["name"]
    assert name.startswith("llm-train-policy-")
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    assert volumes["policy"]["configMap"] == {"name": name}
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    assert mounts["policy"] == {"name": "policy", "mountPath": "/etc/nvtrain", "readOnly": True}
    assert container(objects)["command"] == ["nvtrain", "run", "/etc/nvtrain/policy.toml"]
    changed = MINIMAL + "[checkpoint]\ninterval = 10\n"
    assert by_kind(objects_of(changed), "ConfigMap")["metadata"]["name"] != name


def test_checkpoint_volume_is_mounted_at_the_policy_dir() -> None:
    text = MINIMAL + '[checkpoint]\ndir = "/mnt/fsx/ckpt"\n'
    objects = objects_of(text, ManifestOptions(checkpoint_pvc="fsx-claim"))
    mounts = {m["name"]: m["mountPath"] for m in container(objects)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    assert mounts["checkpoints"] == "/mnt/fsx/ckpt"
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "fsx-claim"}
    default = {v["name"]: v for v in pod_spec(objects_of(MINIMAL))["volumes"]}
    assert default["checkpoints"]["persistentVolumeClaim"] == {"claimName": "llm-train-checkpoints"}


def test_shm_is_memory_backed_and_sized() -> None:
    objects = objects_of(MINIMAL, ManifestOptions(shm_size="32Gi"))
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    mounts = {m["name"]: m["mountPath"] for m in container(objects)["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm"


@pytest.mark.parametrize(("stop", "grace"), [('"1m"', 90), ('"10m"', 630), ("12.5", 43)])
def test_grace_period_is_stop_timeout_plus_margin(stop: str, grace: int) -> None:
    text = MINIMAL + f"stop_timeout = {stop}\n"
    policy = policy_of(text)
    assert grace_period(policy) == grace
    assert grace > policy.job.stop_timeout + 5  # the supervisor kills what is left 5 s after stop_timeout
    assert pod_spec(render(policy, text))["terminationGracePeriodSeconds"] == grace
    assert GRACE_MARGIN >= 10


def test_gpus_follow_nproc_per_node() -> None:
    starter = starter_two_nodes()  # nproc_per_node = 8, backend = "auto"
    resources = container(objects_of(starter))["resources"]
    # CPU and memory by default too (tests/kube/test_manifest_platform.py), sized for 8 ranks.
    assert resources == {
        "requests": {"nvidia.com/gpu": 8, "cpu": "16", "memory": "144Gi"},
        "limits": {"nvidia.com/gpu": 8, "memory": "144Gi"},
    }
    assert pod_spec(objects_of(starter))["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    gloo = set_keys(starter, {("job", "backend"): '"gloo"', ("job", "collective_timeout"): '"45s"'})
    assert "nvidia.com/gpu" not in container(objects_of(gloo))["resources"]["limits"]
    assert "tolerations" not in pod_spec(objects_of(gloo))
    on_gpus = set_keys(starter, {("job", "nproc_per_node"): '"gpu"'})
    with pytest.raises(UsageError, match='nproc_per_node = "gpu"'):
        objects_of(on_gpus)
    assert container(objects_of(on_gpus, ManifestOptions(gpus_per_node=4)))["resources"]["limits"] == {
        "nvidia.com/gpu": 4,
        "memory": "80Gi",  # 16Gi x 4 ranks + 16Gi of /dev/shm
    }
    with pytest.raises(UsageError, match="disagrees with"):
        objects_of(starter, ManifestOptions(gpus_per_node=4))


def test_in_process_restart_on_gpus_sets_the_nccl_variables_nvrx_needs() -> None:
    starter = starter_two_nodes()
    env = env_of(objects_of(starter))
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_NCCL_RETHROW_CUDA_ERRORS"] == "0"
    off = set_keys(starter, {("restart.in_process", "enabled"): "false"})
    assert "NCCL_NVLS_ENABLE" not in env_of(objects_of(off))
    gloo = set_keys(starter, {("job", "backend"): '"gloo"', ("job", "collective_timeout"): '"45s"'})
    assert "NCCL_NVLS_ENABLE" not in env_of(objects_of(gloo))


def test_efa_rdma_cpu_memory_node_selector_env_and_labels() -> None:
    objects = objects_of(starter_two_nodes(), P5)
    c = container(objects)
    assert c["resources"] == {
        "requests": {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32, "cpu": "90", "memory": "900Gi"},
        "limits": {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32, "memory": "900Gi"},
    }
    assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert c["image"] == P5.image
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert env_of(objects)["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert pod_spec(objects)["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    for obj in objects:
        assert obj["metadata"]["labels"]["team"] == "ml"
    rdma = objects_of(MINIMAL, ManifestOptions(resources={"rdma/hca_shared_devices_a": 1}))
    assert container(rdma)["resources"]["limits"]["rdma/hca_shared_devices_a"] == 1
    assert "securityContext" in container(rdma)
    assert "securityContext" not in container(objects_of(MINIMAL))


def test_pods_need_no_api_access_and_no_service_links() -> None:
    spec = pod_spec(objects_of(MINIMAL))
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False


def test_default_image_is_named_after_the_job() -> None:
    assert container(objects_of(MINIMAL))["image"] == "llm-train:latest"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (ManifestOptions(image="two words"), "not an image reference"),
        (ManifestOptions(image="a\nb"), "not an image reference"),
        (ManifestOptions(image=""), "not an image reference"),
        (ManifestOptions(checkpoint_pvc="Bad_Name"), "not a PersistentVolumeClaim name"),
        (ManifestOptions(shm_size="lots"), "not a Kubernetes quantity"),
        (ManifestOptions(cpu="1 core"), "not a Kubernetes quantity"),
        (ManifestOptions(memory="8Gi", shm_size="16Gi"), "memory-backed"),
        (ManifestOptions(efa=-1), "negative"),
        (ManifestOptions(backoff_limit=-1), "negative"),
        (ManifestOptions(gpus_per_node=-2), "negative"),
        (ManifestOptions(resources={"hugepages": 1}), "extended resource"),
        (ManifestOptions(resources={"rdma/x": 0}), "at least 1"),
        (ManifestOptions(labels={"bad key!": "x"}), "label name"),
        (ManifestOptions(labels={"team": "a b"}), "value is not valid"),
        (ManifestOptions(labels={"app.kubernetes.io/instance": "other"}), "set by nvtrain"),
        (ManifestOptions(node_selector={"zone": "x" * 64}), "value is not valid"),
        (ManifestOptions(env={"1=2": "x"}), "environment variable name"),
        (ManifestOptions(env={"NAME\n": "x"}), "environment variable name"),
        (ManifestOptions(labels={"team\n": "x"}), "label name"),
        (ManifestOptions(labels={"team": "ml\n"}), "value is not valid"),
        (ManifestOptions(shm_size="1Gi\n"), "not a Kubernetes quantity"),
        (ManifestOptions(env={"POD_IP": "1.2.3.4"}), "set by the manifest"),
        (ManifestOptions(env={"NVTRAIN_RUN_ID": "fixed"}), "set by the manifest"),
    ],
)
def test_bad_options_are_usage_errors(options: ManifestOptions, match: str) -> None:
    with pytest.raises(UsageError, match=match) as caught:
        objects_of(MINIMAL, options)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    "directory",
    ["/", "/dev/shm", "/dev/shm/ckpt", "/etc/nvtrain", "/etc/nvtrain/x", "/etc", "/proc/x", "/a/../b"],
)
def test_checkpoint_dirs_that_cannot_be_a_mount_are_refused(directory: str) -> None:
    text = MINIMAL + f'[checkpoint]\ndir = "{directory}"\n'
    with pytest.raises(UsageError, match="cannot be mounted"):
        objects_of(text)


# -- memory of the host copies ([checkpoint] memory_dir) ------------------------------------------

EIGHT = MINIMAL + "nproc_per_node = 8\n"
"""8 ranks per pod; the host copies in /dev/shm (the schema's defaults)."""
OWN_DIR = EIGHT + '[checkpoint]\nmemory_dir = "/hostcopy"\n'
"""The host copies in a memory-backed folder of their own."""
CPU_RANKS = set_keys(
    starter_two_nodes(),
    {
        ("job", "backend"): '"gloo"',
        ("job", "collective_timeout"): '"45s"',
        ("job", "nproc_per_node"): '"cpu"',
    },
)


def volumes_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return {v["name"]: v for v in pod_spec(objects)["volumes"]}


def mounts_of(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container(objects)["volumeMounts"]}


def memory_backed(objects: list[dict[str, Any]]) -> dict[str, str]:
    """sizeLimit of every emptyDir with medium Memory, by volume name."""
    return {
        name: v["emptyDir"]["sizeLimit"]
        for name, v in volumes_of(objects).items()
        if v.get("emptyDir", {}).get("medium") == "Memory"
    }


@pytest.mark.parametrize(
    ("nproc", "memory_dir", "state", "shm", "size"),
    [
        (8, "/dev/shm", "20Gi", "16Gi", "336Gi"),  # 16Gi + 2 x 20Gi x 8
        (1, "/dev/shm", "20Gi", "16Gi", "56Gi"),
        (8, "/dev/shm", "1.5Gi", "16Gi", "40Gi"),
        (8, "/dev/shm", "10G", "16G", "176G"),  # decimal stays decimal
        (8, "/dev/shm", "512Mi", "1Gi", "9Gi"),
        (8, "/dev/shm", "10G", "16Gi", "173027216Ki"),  # 16Gi + 160G, exact
        (8, "/dev/shm", "100", "16Gi", "17179870784"),  # no suffix divides the sum: bytes
        (8, "/dev/shm/nvtrain", "1Gi", "16Gi", "32Gi"),  # a folder in /dev/shm is in its volume
        (8, "/dev/shm/", "1Gi", "16Gi", "32Gi"),
    ],
)
def test_state_per_rank_sizes_dev_shm_for_the_two_copies_of_every_rank(
    nproc: int, memory_dir: str, state: str, shm: str, size: str
) -> None:
    text = MINIMAL + f'nproc_per_node = {nproc}\n[checkpoint]\nmemory_dir = "{memory_dir}"\n'
    objects = objects_of(text, ManifestOptions(state_per_rank=state, shm_size=shm))
    assert memory_backed(objects) == {"dshm": size}
    assert mounts_of(objects) == {"policy": "/etc/nvtrain", "checkpoints": "/checkpoints", "dshm": "/dev/shm"}


def test_state_per_rank_mounts_a_memory_backed_volume_at_another_memory_dir() -> None:
    objects = objects_of(OWN_DIR, ManifestOptions(state_per_rank="20Gi"))
    assert volumes_of(objects)["hostcopy"] == {
        "name": "hostcopy",
        "emptyDir": {"medium": "Memory", "sizeLimit": "320Gi"},
    }
    assert mounts_of(objects)["hostcopy"] == "/hostcopy"
    assert memory_backed(objects) == {"dshm": "16Gi", "hostcopy": "320Gi"}  # /dev/shm keeps --shm-size
    # Without --state-per-rank nothing is mounted there (and `notes` says so, below).
    assert "hostcopy" not in volumes_of(objects_of(OWN_DIR))


def test_without_state_per_rank_the_sizes_stay_as_they_were() -> None:
    for text in (MINIMAL, EIGHT, OWN_DIR):
        assert memory_backed(objects_of(text, ManifestOptions(shm_size="32Gi"))) == {"dshm": "32Gi"}


@pytest.mark.parametrize(
    "table",
    [
        "async = false\nkeep = 1\n",
        "in_memory = false\n",
        'memory_dir = ""\n',
        'in_memory = false\nmemory_dir = "/etc/nvtrain"\n',
    ],
)
def test_state_per_rank_changes_nothing_when_the_policy_keeps_no_host_copy(table: str) -> None:
    text = EIGHT + "[checkpoint]\n" + table
    policy = policy_of(text)
    assert not keeps_host_copy(policy)
    options = ManifestOptions(state_per_rank="20Gi", memory="100Gi")
    assert render(policy, text, options) == render(policy, text, ManifestOptions(memory="100Gi"))
    assert host_copy_bytes(policy, options) is None
    [note] = notes(policy, options)
    assert note.startswith("--state-per-rank changes nothing: the policy keeps no host copy")
    assert notes(policy, ManifestOptions()) == []


def test_notes_say_that_the_host_copies_are_not_sized() -> None:
    [shm] = notes(policy_of(EIGHT), ManifestOptions(shm_size="8Gi"))
    assert "memory_dir '/dev/shm' holds the host copies" in shm
    assert "2 × state per rank × 8 ranks per pod" in shm
    assert "/dev/shm is sized 8Gi (--shm-size)" in shm and "--state-per-rank QUANTITY" in shm
    [own] = notes(policy_of(OWN_DIR), ManifestOptions())
    assert "memory_dir '/hostcopy'" in own and "no memory-backed volume is mounted there" in own
    assert shm.endswith(
        "(per rank 2 slots of its own); /dev/shm is sized 8Gi (--shm-size) without them: "
        "pass --state-per-rank QUANTITY (one rank's model + optimizer state) to size it"
    )
    # The starter: 2 pods, peer copy on (--cpu and --memory: no note that the ranks are unknown).
    [cpu] = notes(policy_of(CPU_RANKS), ManifestOptions(cpu="8", memory="64Gi"))
    assert "3 × state per rank, each rank of a pod" in cpu
    assert "(per rank 2 slots of its own + 1 peer copy of the same local rank on the previous pod)" in cpu
    for text in (EIGHT, OWN_DIR):
        assert notes(policy_of(text), ManifestOptions(state_per_rank="1Gi")) == []


TWO_PODS = EIGHT + "[rendezvous]\nnodes = 2\n"
"""2 pods of 8 ranks: with the host copy on, each rank also keeps the peer copy of another's."""


@pytest.mark.parametrize(
    ("text", "copies", "shm", "own_dir"),
    [
        # 2 pods, peer_copy on (the default, or written): 16Gi + 3 x 20Gi x 8; 3 x 20Gi x 8
        (TWO_PODS, 3, "496Gi", "480Gi"),
        (TWO_PODS + "[checkpoint]\npeer_copy = true\n", 3, "496Gi", "480Gi"),
        (TWO_PODS.replace("nodes = 2", "nodes = 16"), 3, "496Gi", "480Gi"),  # per pod, any count
        # peer_copy off: the 2 slots of every rank, 16Gi + 2 x 20Gi x 8; 2 x 20Gi x 8
        (TWO_PODS + "[checkpoint]\npeer_copy = false\n", 2, "336Gi", "320Gi"),
        # 1 pod: no next pod to send the copy to, whatever peer_copy says
        (EIGHT, 2, "336Gi", "320Gi"),
        (EIGHT + "[checkpoint]\npeer_copy = true\n", 2, "336Gi", "320Gi"),
    ],
)
def test_the_peer_copy_adds_one_copy_per_rank_with_two_or_more_pods(
    text: str, copies: int, shm: str, own_dir: str
) -> None:
    policy = policy_of(text)
    assert host_copies_per_rank(policy) == copies
    assert sends_peer_copy(policy) == (copies == 3)
    options = ManifestOptions(state_per_rank="20Gi")
    assert host_copy_bytes(policy, options) == copies * 20 * 2**30 * 8
    assert memory_backed(objects_of(text, options)) == {"dshm": shm}
    # memory_dir outside /dev/shm: the volume mounted there holds the same copies.
    in_own_dir = text + ("" if "[checkpoint]" in text else "[checkpoint]\n") + 'memory_dir = "/hostcopy"\n'
    assert host_copies_per_rank(policy_of(in_own_dir)) == copies
    assert memory_backed(objects_of(in_own_dir, options)) == {"dshm": "16Gi", "hostcopy": own_dir}


def test_no_host_copy_means_no_copies_and_no_peer_copy() -> None:
    for table in ("async = false\nkeep = 1\n", "in_memory = false\n", 'memory_dir = ""\n'):
        policy = policy_of(TWO_PODS + "[checkpoint]\n" + table)
        assert (host_copies_per_rank(policy), sends_peer_copy(policy)) == (0, False)
        assert host_copy_bytes(policy, ManifestOptions(state_per_rank="20Gi")) is None


def test_notes_and_the_memory_limit_say_what_the_peer_copy_adds() -> None:
    [note] = notes(policy_of(TWO_PODS), ManifestOptions())
    assert (
        "holds the host copies of the checkpoint, 3 × state per rank × 8 ranks per pod (per rank 2 slots"
        in note
    )
    assert "+ 1 peer copy of the same local rank on the previous pod)" in note
    [off] = notes(policy_of(TWO_PODS + "[checkpoint]\npeer_copy = false\n"), ManifestOptions())
    assert "2 × state per rank × 8 ranks per pod (per rank 2 slots of its own)" in off
    # 16Gi + 3 x 20Gi x 8 = 496Gi of /dev/shm
    objects_of(TWO_PODS, ManifestOptions(state_per_rank="20Gi", memory="497Gi"))
    with pytest.raises(
        UsageError, match="496Gi of memory-backed volumes, not below --memory 496Gi"
    ) as caught:
        objects_of(TWO_PODS, ManifestOptions(state_per_rank="20Gi", memory="496Gi"))
    assert "3 × --state-per-rank 20Gi × 8 ranks = 480Gi; per rank 2 slots of its own + 1 peer copy" in str(
        caught.value
    )


def test_ranks_per_pod_come_from_nproc_per_node_or_the_gpus() -> None:
    options = ManifestOptions(state_per_rank="10Gi")
    assert ranks_per_pod(policy_of(EIGHT), options) == 8
    on_gpus = EIGHT.replace("nproc_per_node = 8", 'nproc_per_node = "gpu"')
    with pytest.raises(UsageError, match='nproc_per_node = "gpu"') as caught:
        objects_of(on_gpus, options)
    assert caught.value.fix and "--gpus" in caught.value.fix
    four = dataclasses.replace(options, gpus_per_node=4)
    assert memory_backed(objects_of(on_gpus, four)) == {"dshm": "96Gi"}  # 16Gi + 2 x 10Gi x 4
    with pytest.raises(UsageError, match="no GPUs per pod"):
        objects_of(on_gpus, dataclasses.replace(options, gpus_per_node=0))
    with pytest.raises(UsageError, match='nproc_per_node = "cpu"') as caught:
        objects_of(CPU_RANKS, options)
    assert "--state-per-rank" in str(caught.value)
    assert memory_backed(objects_of(CPU_RANKS)) == {"dshm": "16Gi"}  # without the option it renders


def test_memory_limit_must_hold_every_memory_backed_volume() -> None:
    # 16Gi + 2 x 20Gi x 8 = 336Gi of /dev/shm
    objects_of(EIGHT, ManifestOptions(state_per_rank="20Gi", memory="337Gi"))
    with pytest.raises(
        UsageError, match="336Gi of memory-backed volumes, not below --memory 336Gi"
    ) as caught:
        objects_of(EIGHT, ManifestOptions(state_per_rank="20Gi", memory="336Gi"))
    assert "2 × --state-per-rank 20Gi × 8 ranks = 320Gi" in str(caught.value)
    assert caught.value.fix == "raise --memory, or lower --shm-size"
    # The volume at memory_dir counts as well as /dev/shm.
    objects_of(OWN_DIR, ManifestOptions(state_per_rank="20Gi", memory="400Gi"))
    with pytest.raises(UsageError, match="memory-backed volumes"):
        objects_of(OWN_DIR, ManifestOptions(state_per_rank="20Gi", memory="300Gi"))
    # No host copy: /dev/shm alone, as before.
    no_copy = EIGHT + "[checkpoint]\nin_memory = false\n"
    objects_of(no_copy, ManifestOptions(state_per_rank="20Gi", memory="17Gi"))


@pytest.mark.parametrize("value", ["lots", "20 Gi", "20GB", "-1Gi", "0", "0Gi", "1Gi\n"])
def test_bad_state_per_rank_is_a_usage_error_that_names_the_flag(value: str) -> None:
    for text in (EIGHT, EIGHT + "[checkpoint]\nin_memory = false\n"):
        with pytest.raises(UsageError, match="--state-per-rank") as caught:
            objects_of(text, ManifestOptions(state_per_rank=value))
        assert repr(value) in str(caught.value)
        assert caught.value.fix and caught.value.exit_code == 2


@pytest.mark.parametrize(
    "directory",
    [
        "/",
        "/dev",
        "/dev/hostcopy",
        "/proc/x",
        "/sys",
        "/etc/nvtrain",
        "/etc/nvtrain/x",
        "/etc",
        "/checkpoints",
        "/checkpoints/hostcopy",
        "/a/../b",
        "/dev/shm/../etc",
        "/host:copy",
        "/host\ncopy",
    ],
)
def test_memory_dirs_that_overlap_other_mounts_are_refused(directory: str) -> None:
    text = EIGHT + f"[checkpoint]\nmemory_dir = {json.dumps(directory)}\n"
    for options in (ManifestOptions(), ManifestOptions(state_per_rank="1Gi")):
        with pytest.raises(UsageError, match=r"\[checkpoint\] memory_dir") as caught:
            objects_of(text, options)
        assert caught.value.fix


def test_a_memory_dir_that_holds_the_checkpoint_dir_is_refused() -> None:
    text = EIGHT + '[checkpoint]\ndir = "/mnt/ckpt"\nmemory_dir = "/mnt"\n'
    with pytest.raises(UsageError, match="overlaps"):
        objects_of(text, ManifestOptions(state_per_rank="1Gi"))


# -- JobSet --------------------------------------------------------------------------------------


def test_jobset_wraps_the_same_job_and_names_pods_as_nvtrain_dials_them() -> None:
    text = starter_named("llm-workers-0")
    job = by_kind(objects_of(text), "Job")
    objects = objects_of(text, ManifestOptions(jobset=True))
    assert [o["kind"] for o in objects] == ["ConfigMap", "NetworkPolicy", "JobSet"]
    jobset = by_kind(objects, "JobSet")
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert jobset["metadata"]["name"] == "llm"
    [replicated] = jobset["spec"]["replicatedJobs"]
    assert replicated["name"] == "workers" and replicated["replicas"] == 1
    # JobSet's pods are <jobset>-<replicated job>-<job index>-<pod index>: pod 0 is <job name>-0.
    assert f"{jobset['metadata']['name']}-{replicated['name']}-0" == "llm-workers-0"
    assert jobset["spec"]["network"] == {
        "enableDNSHostnames": True,
        "subdomain": "llm-workers-0",
        "publishNotReadyAddresses": True,
    }
    spec = replicated["template"]["spec"]
    run_id = {e["name"]: e for e in spec["template"]["spec"]["containers"][0]["env"]}["NVTRAIN_RUN_ID"]
    assert run_id["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['jobset.sigs.k8s.io/jobset-uid']"
    for key in ("completionMode", "completions", "parallelism", "backoffLimit", "podFailurePolicy"):
        assert spec[key] == job["spec"][key]
    assert jobset["spec"]["failurePolicy"]["rules"] == [
        {"name": "nvtrainNeverRetry", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
    ]


@pytest.mark.parametrize("name", ["llm-train", "train-0", "llm-0", "a--0", "llm--workers-0"])
def test_jobset_refuses_job_names_it_cannot_match(name: str) -> None:
    text = MINIMAL.replace('"llm-train"', f'"{name}"')
    with pytest.raises(UsageError, match="<jobset>-<replicated job>-0"):
        objects_of(text, ManifestOptions(jobset=True))


# -- [rendezvous] store = "control": the control Job ------------------------------------------


def jobs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "Job"}


def workers(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The training pods' spec."""
    return jobs(objects)["llm-train"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def control_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return jobs(objects)["llm-train-control"]["spec"]["template"]  # type: ignore[no-any-return]


def test_control_store_adds_the_control_job_before_the_workers() -> None:
    objects = objects_of(CONTROL)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects[1:]] == [
        ("Service", "llm-train"),
        ("NetworkPolicy", "llm-train-peers"),
        ("Job", "llm-train-control"),
        ("Job", "llm-train"),
    ]
    # The training Job is the one of store = "pod0", but for the name of the policy's ConfigMap.
    pod0 = render(policy_of(CONTROL.replace('store = "control"\n', "")), CONTROL)
    assert jobs(objects)["llm-train"] == by_kind(pod0, "Job")


def test_control_pod_gets_the_dns_name_the_workers_dial_and_runs_nvtrain_control() -> None:
    policy = policy_of(CONTROL)
    objects = render(policy, CONTROL, P5)
    job = jobs(objects)["llm-train-control"]
    template = job["spec"]["template"]
    spec = template["spec"]
    # <hostname>.<subdomain>.<namespace>.svc.<cluster domain> is the name nvtrain run dials.
    namespace = job["metadata"]["namespace"]
    fqdn = f"{spec['hostname']}.{spec['subdomain']}.{namespace}.svc.{policy.rendezvous.cluster_domain}"
    assert fqdn == control_name(policy)
    assert spec["hostname"] == "llm-train-control" and spec["subdomain"] == "llm-train"
    [control] = spec["containers"]
    assert control["name"] == "control"
    assert control["command"] == ["nvtrain", "control", "/etc/nvtrain/policy.toml"]
    assert control["image"] == P5.image == workers(objects)["containers"][0]["image"]
    assert {e["name"]: e.get("value", e.get("valueFrom")) for e in control["env"]} == {
        "POD_IP": {"fieldRef": {"fieldPath": "status.podIP"}},
        "PYTHONUNBUFFERED": "1",
    }
    assert control["ports"] == [{"name": "rendezvous", "containerPort": 29500, "protocol": "TCP"}]
    assert spec["restartPolicy"] == "Never"
    assert spec["enableServiceLinks"] is False and spec["automountServiceAccountToken"] is False
    configmap = by_kind(objects, "ConfigMap")["metadata"]["name"]
    assert spec["volumes"] == [{"name": "policy", "configMap": {"name": configmap}}]
    assert control["volumeMounts"] == [{"name": "policy", "mountPath": "/etc/nvtrain", "readOnly": True}]
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 1
    assert "completionMode" not in job["spec"]
    assert job["spec"]["backoffLimit"] == P5.backoff_limit
    fail, ignore = job["spec"]["podFailurePolicy"]["rules"]
    assert fail["action"] == "FailJob"
    assert fail["onExitCodes"] == {"containerName": "control", "operator": "In", "values": [2]}
    assert ignore["action"] == "Ignore"


def test_control_pod_is_a_small_cpu_pod_off_the_gpu_nodes() -> None:
    objects = render(policy_of(CONTROL), CONTROL, P5)  # GPUs, EFA, cpu/memory, node selector, env
    spec = control_pod(objects)["spec"]
    [control] = spec["containers"]
    assert control["resources"] == CONTROL_RESOURCES
    assert control["resources"] == {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    assert "securityContext" not in control
    for key in ("tolerations", "nodeSelector"):
        assert key not in spec
    # `nvtrain control` gives the store process [job] stop_timeout after SIGTERM, as `nvtrain run` does.
    assert spec["terminationGracePeriodSeconds"] == grace_period(policy_of(CONTROL))
    assert "NCCL_DEBUG" not in json.dumps(control)
    # The training pods keep what the options give them.
    assert workers(objects)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert workers(objects)["nodeSelector"] == P5.node_selector
    assert workers(objects)["tolerations"]


def test_service_and_network_policy_cover_the_control_pod() -> None:
    objects = render(policy_of(CONTROL), CONTROL, P5)
    labels = control_pod(objects)["metadata"]["labels"]
    service = by_kind(objects, "Service")["spec"]["selector"]
    peers = by_kind(objects, "NetworkPolicy")["spec"]
    assert service.items() <= labels.items()
    assert peers["podSelector"]["matchLabels"].items() <= labels.items()
    assert peers["ingress"] == [{"from": [{"podSelector": {"matchLabels": service}}]}]
    assert labels["app.kubernetes.io/component"] == "control"
    assert labels["team"] == "ml"  # --label reaches the control Job and its pod too
    assert jobs(objects)["llm-train-control"]["metadata"]["labels"] == labels
    # The training pods keep the labels they had: no component label.
    workers = jobs(objects)["llm-train"]["spec"]["template"]["metadata"]["labels"]
    assert "app.kubernetes.io/component" not in workers


def test_component_label_is_nvtrains_only_with_a_control_job() -> None:
    options = ManifestOptions(labels={"app.kubernetes.io/component": "training"})
    with pytest.raises(UsageError, match="app.kubernetes.io/component is set by nvtrain"):
        objects_of(CONTROL, options)
    assert by_kind(objects_of(MINIMAL, options), "Job")["metadata"]["labels"]["app.kubernetes.io/component"]


def test_only_a_store_to_move_gets_a_control_job() -> None:
    """From 2 nodes on with store = "control"; not by default, with "pod0", or on one node
    (standalone, with no store to move)."""
    kinds = ["ConfigMap", "Service", "NetworkPolicy", "Job"]
    assert [o["kind"] for o in objects_of(CONTROL)] == [*kinds, "Job"]
    assert [o["kind"] for o in objects_of(CONTROL.replace("nodes = 4", "nodes = 2"))] == [*kinds, "Job"]
    for text in (
        MINIMAL,
        CONTROL.replace('store = "control"', 'store = "pod0"'),
        CONTROL.replace("nodes = 4", "nodes = 1"),
    ):
        assert [o["kind"] for o in objects_of(text)] == kinds, text


# -- golden files ------------------------------------------------------------------------------


def test_golden_minimal_policy() -> None:
    """Only [job] name and script: every other value is the schema's default."""
    check_golden("minimal.yaml", dump(objects_of(MINIMAL)))


def test_golden_starter_policy() -> None:
    """The policy `nvtrain init` writes, set for 2 nodes, with the default options."""
    check_golden("starter.yaml", dump(objects_of(starter_two_nodes())))


def test_golden_p5_options() -> None:
    check_golden("starter_p5.yaml", dump(objects_of(starter_two_nodes(), P5)))


def test_golden_control_store() -> None:
    """``[rendezvous] store = "control"``: the control Job between the NetworkPolicy and the Job."""
    check_golden("control.yaml", dump(objects_of(CONTROL)))


def test_golden_jobset() -> None:
    """The JobSet is also schema-checked (``jobset_errors``, below); this pins its exact shape."""
    check_golden(
        "starter_jobset.yaml", dump(objects_of(starter_named("llm-workers-0"), ManifestOptions(jobset=True)))
    )


# -- Kubernetes OpenAPI schemas ----------------------------------------------------------------

LONG_NAME = "llm-" + "x1" * 26 + "-end"
"""60 characters: with 16 nodes the longest pod name, ``<name>-15``, is 63, a DNS label's limit."""
LONG_CONTROL_NAME = "llm-" + "c3" * 23 + "-end"
"""55 characters: the control pod's hostname, ``<name>-control``, is 63."""
LONG_JOBSET_NAME = "llm-" + "y2" * 20 + "-workers-0"
"""54 characters: with 16 nodes the JobSet webhook's longest pod name, ``<name>-15`` plus the
6-character random suffix of a pod name, is 63."""
LONG_NAMESPACE = "ns-" + "0z" * 30
UNUSUAL_ARGS = [
    '--note=it\'s "quoted"',
    "key: value",
    "multi\nline: - item\n---\nkind: Secret",
    "#not-a-comment",
    "{{ .Values.x }} ${HOME}",
    "yes",
    "--lr=3e-4",
    "",
]
UNUSUAL = (
    "[job]\n"
    f'name = "{LONG_NAME}"\n'
    'script = "train.py"\n'
    f"args = {json.dumps(UNUSUAL_ARGS, ensure_ascii=False)}\n"
    "nproc_per_node = 8\n"
    "[rendezvous]\n"
    f'namespace = "{LONG_NAMESPACE}"\n'
    "nodes = 16\n"
    "port = 65535\n"
    "[checkpoint]\n"
    "dir = \"/mnt/ckpt v2/#run 'x'\"\n"
    "[metrics]\n"
    "enabled = true\n"
    "port = 1024\n"
)
UNUSUAL_OPTIONS = ManifestOptions(
    image="registry-1.example.com:5000/team_a/sub.group/llm__train:v1.2.3-rc.1_b@sha256:" + "a" * 64,
    cpu="95500m",
    memory="1.5Ti",
    shm_size="1000Gi",
    resources={"rdma/hca_shared_devices_a": 1},
    backoff_limit=0,
    labels={"example.com/team": "ml.research_1"},
    env={"NOTE": "a: b\n- c # d", "EMPTY": ""},
    node_selector={"topology.kubernetes.io/zone": "us-east-1a"},
)

SCHEMA_CASES = {
    "minimal": (MINIMAL, ManifestOptions()),
    "metrics": (METRICS_ON, ManifestOptions()),
    "starter": (starter_two_nodes(), ManifestOptions()),
    "starter-p5": (starter_two_nodes(), P5),
    "jobset": (starter_named("llm-workers-0"), ManifestOptions(jobset=True)),
    "jobset-p5": (starter_named("llm-workers-0"), dataclasses.replace(P5, jobset=True)),
    "gloo-cpu": (
        set_keys(
            starter_two_nodes(),
            {
                ("job", "backend"): '"gloo"',
                ("job", "collective_timeout"): '"45s"',
                ("job", "nproc_per_node"): '"cpu"',
            },
        ),
        ManifestOptions(cpu="500m", memory="64Gi", shm_size="1Gi", resources={"rdma/hca": 1}),
    ),
    "unusual-names-and-values": (UNUSUAL, UNUSUAL_OPTIONS),
    "control": (CONTROL, ManifestOptions()),
    "control-p5": (CONTROL, P5),
    "control-metrics": (CONTROL + "[metrics]\nenabled = true\n", ManifestOptions()),
    "unusual-control": (with_control_store(UNUSUAL.replace(LONG_NAME, LONG_CONTROL_NAME)), UNUSUAL_OPTIONS),
    "host-copy-shm": (starter_two_nodes(), dataclasses.replace(P5, state_per_rank="20Gi")),
    "host-copy-volume": (
        EIGHT + '[checkpoint]\nmemory_dir = "/var/run/nvtrain hostcopy"\n',
        dataclasses.replace(P5, state_per_rank="2500M"),
    ),
    "host-copy-jobset": (
        starter_named("llm-workers-0"),
        ManifestOptions(jobset=True, state_per_rank="10G", shm_size="1Gi"),
    ),
    "unusual-jobset": (
        UNUSUAL.replace(LONG_NAME, LONG_JOBSET_NAME),
        dataclasses.replace(UNUSUAL_OPTIONS, jobset=True),
    ),
}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_every_object_is_valid_against_the_kubernetes_schema(case: str, version: str) -> None:
    """Every object, the JobSet too: its own fields against the CRD's, and its Job template as a
    batch/v1 Job against the Kubernetes schema (``templates_helpers.jobset_errors``)."""
    text, options = SCHEMA_CASES[case]
    objects = load_all(dump(objects_of(text, options)))
    assert ("JobSet" in [o["kind"] for o in objects]) == options.jobset
    controls = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].endswith("-control")]
    assert len(controls) == (1 if case.startswith(("control", "unusual-control")) else 0)
    errors = [e for o in objects for e in object_errors(o, version)]
    assert not errors, "\n".join(errors)


def test_unusual_names_and_values_reach_the_objects_unchanged() -> None:
    objects = load_all(dump(objects_of(UNUSUAL, UNUSUAL_OPTIONS)))
    job = by_kind(objects, "Job")
    assert len(LONG_NAME) == 60 and len(LONG_NAMESPACE) == 63
    assert job["metadata"]["name"] == LONG_NAME
    assert {o["metadata"]["namespace"] for o in objects} == {LONG_NAMESPACE}
    # The longest pod name, <name>-15, is exactly a DNS label's 63 characters.
    assert len(f"{LONG_NAME}-{job['spec']['completions'] - 1}") == 63
    [trainer] = job["spec"]["template"]["spec"]["containers"]
    assert trainer["image"] == UNUSUAL_OPTIONS.image
    assert by_kind(objects, "ConfigMap")["data"]["policy.toml"] == UNUSUAL
    assert policy_of(UNUSUAL).job.args == UNUSUAL_ARGS
    assert {e["name"]: e.get("value") for e in trainer["env"]}["NOTE"] == UNUSUAL_OPTIONS.env["NOTE"]
    mounts = {m["name"]: m["mountPath"] for m in trainer["volumeMounts"]}
    assert mounts["checkpoints"] == "/mnt/ckpt v2/#run 'x'"


def test_jobset_check_catches_a_broken_object() -> None:
    """The JobSet check is real, for its own fields and for the Job template inside it."""
    text, options = SCHEMA_CASES["jobset"]
    jobset = by_kind(objects_of(text, options), "JobSet")
    for version in KUBERNETES_VERSIONS:
        assert object_errors(jobset, version) == []
    broken = copy.deepcopy(jobset)
    del broken["spec"]["replicatedJobs"][0]["name"]
    assert any("'name' is a required property" in e for e in object_errors(broken, OLDEST))
    broken = copy.deepcopy(jobset)
    broken["spec"]["failurePolicy"]["rules"][0]["action"] = "Retry"
    assert object_errors(broken, OLDEST)
    broken = copy.deepcopy(jobset)
    broken["apiVersion"] = "jobset.x-k8s.io/v1"
    assert object_errors(broken, OLDEST)
    broken = copy.deepcopy(jobset)
    broken["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["restartPolicyy"] = "Never"
    for version in KUBERNETES_VERSIONS:
        assert any("replicated job workers" in e for e in object_errors(broken, version))


def test_schema_versions() -> None:
    """1.28 and the newest schemas kubernetes-validate ships (it bundles them: no download)."""
    oldest, newest = KUBERNETES_VERSIONS
    assert oldest == OLDEST == "1.28"
    shipped = {kv.major_minor(v) for v in kv.all_versions()}
    assert OLDEST in shipped, f"kubernetes-validate no longer ships the {OLDEST} schemas"
    assert newest == max(shipped, key=lambda v: tuple(map(int, v.split("."))))
    assert tuple(map(int, newest.split("."))) >= (1, 37)


def test_schema_validation_needs_no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubernetes-validate reads the schemas it ships; with sockets refused it still works."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("kubernetes-validate opened a network connection")

    kv.schema_contents.cache_clear()  # type: ignore[attr-defined]  # read the files again
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for obj in load_all(dump(objects_of(MINIMAL))):
        for version in KUBERNETES_VERSIONS:
            assert schema_errors(obj, version) is None


def test_schema_check_catches_a_broken_object() -> None:
    """The check is real: a misspelt field fails the strict schema."""
    job = by_kind(objects_of(MINIMAL), "Job")
    job["spec"]["template"]["spec"]["restartPolicyy"] = "Never"
    for version in KUBERNETES_VERSIONS:
        assert schema_errors(job, version) is not None

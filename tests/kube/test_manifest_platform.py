"""``nvtrain manifest`` as platform teams run it: QoS (``--qos``, default CPU and memory), Pod
Security (``--pod-security``, ``--run-as-user``), scheduling (``--toleration``,
``--priority-class``, ``--scheduler-name``, ``--service-account``, ``--annotation``, ``--ttl``,
the image pull policy), Kueue (``--queue``, the control pod in the JobSet), Volcano (the
PodGroup) and the Prometheus Operator (``--pod-monitor``)."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from crd_schemas import crd_errors
from templates_helpers import (
    CONTROL,
    KUBERNETES_VERSIONS,
    MINIMAL,
    by_kind,
    check_golden,
    load_all,
    object_errors,
    policy_of,
    set_keys,
    starter_named,
    starter_two_nodes,
    with_control_store,
)
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.errors import UsageError
from nvtrain.kube import podsecurity, qos, scheduling
from nvtrain.kube.init import starter_text
from nvtrain.kube.manifest import render
from nvtrain.kube.objects import CONTROL_RESOURCES
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.quantity import parse_quantity
from nvtrain.kube.sizing import notes
from nvtrain.kube.yaml_io import dump
from nvtrain.kubenames import control_name

runner = CliRunner()

STARTER = starter_two_nodes()
"""8 ranks per pod, 2 pods, the host copies in /dev/shm with the peer copy."""
JOBSET_CONTROL = with_control_store(starter_named("llm-workers-0"))
"""The starter as a JobSet (job name llm-workers-0) with the rendezvous store in a control pod."""
METRICS = MINIMAL + "nproc_per_node = 8\n[rendezvous]\nnodes = 2\n[metrics]\nenabled = true\nport = 9400\n"
CPU_RANKS = set_keys(
    STARTER,
    {
        ("job", "backend"): '"gloo"',
        ("job", "collective_timeout"): '"45s"',
        ("job", "nproc_per_node"): '"cpu"',
    },
)
EFA = ManifestOptions(efa=32)


def objects_of(text: str, options: ManifestOptions | None = None) -> list[dict[str, Any]]:
    return render(policy_of(text), text, options)


def pods(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod template of the objects, by the name of its Job (``<jobset>/<replicated job>``)."""
    found: dict[str, dict[str, Any]] = {}
    for obj in objects:
        if obj["kind"] == "Job":
            found[obj["metadata"]["name"]] = obj["spec"]["template"]
        elif obj["kind"] == "JobSet":
            for replicated in obj["spec"]["replicatedJobs"]:
                found[f"{obj['metadata']['name']}/{replicated['name']}"] = replicated["template"]["spec"][
                    "template"
                ]
    assert found
    return found


def containers_of(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"], *spec.get("ephemeralContainers", [])]


def trainer(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [training] = [p for name, p in pods(objects).items() if not name.endswith("control")]
    [container] = training["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def control_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [control] = [p for name, p in pods(objects).items() if name.endswith("control")]
    return control


def memory_bytes(quantity: str) -> int:
    return int(parse_quantity("test", quantity))


# -- QoS -----------------------------------------------------------------------------------------


def qos_class(spec: dict[str, Any]) -> str:
    """The pod's QoS class, by Kubernetes' rules (pkg/apis/core/helper/qos): Guaranteed when
    every container has CPU and memory limits and every request equals its limit (a missing
    request defaults to the limit), BestEffort when no container requests or limits CPU or
    memory, Burstable otherwise."""
    guaranteed, best_effort = True, True
    for container in containers_of(spec):
        resources = container.get("resources", {})
        limits, requests = resources.get("limits", {}), resources.get("requests", {})
        for name in ("cpu", "memory"):
            if name in limits or name in requests:
                best_effort = False
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                guaranteed = False
    return "Guaranteed" if guaranteed else "BestEffort" if best_effort else "Burstable"


def test_training_pods_request_cpu_and_memory_by_default_and_are_burstable() -> None:
    """Before: only GPUs were requested, so the pods were BestEffort, the first evicted."""
    objects = objects_of(STARTER)
    resources = trainer(objects)["resources"]
    assert resources["requests"] == {"nvidia.com/gpu": 8, "cpu": "16", "memory": "144Gi"}
    assert resources["limits"] == {"nvidia.com/gpu": 8, "memory": "144Gi"}  # no CPU limit
    assert qos.CPU_PER_RANK == 2 and qos.MEMORY_PER_RANK == 16 * 2**30
    for pod in pods(objects).values():
        assert qos_class(pod["spec"]) == "Burstable"


@pytest.mark.parametrize(
    ("text", "options", "memory"),
    [
        (MINIMAL, ManifestOptions(), "32Gi"),  # 16Gi x 1 rank + 16Gi /dev/shm
        (STARTER, ManifestOptions(shm_size="64Gi"), "192Gi"),  # 16Gi x 8 + 64Gi
        # 16Gi x 8 + 16Gi + 3 x 20Gi x 8 (2 slots + the peer copy per rank, in /dev/shm)
        (STARTER, ManifestOptions(state_per_rank="20Gi"), "624Gi"),
        # The host copies in a volume of their own count the same: 16Gi x 8 + 16Gi + 2 x 1Gi x 8
        (MINIMAL + 'nproc_per_node = 8\n[checkpoint]\nmemory_dir = "/hostcopy"\n', "1Gi", "160Gi"),
        (STARTER, ManifestOptions(shm_size="10G"), "143983353Ki"),  # 128Gi + 10G, exact
    ],
)
def test_default_memory_counts_every_memory_backed_volume(text: str, options: Any, memory: str) -> None:
    if isinstance(options, str):
        options = ManifestOptions(state_per_rank=options)
    objects = objects_of(text, options)
    resources = trainer(objects)["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == memory
    [training] = [p for n, p in pods(objects).items() if not n.endswith("control")]
    backed = sum(
        memory_bytes(v["emptyDir"]["sizeLimit"])
        for v in training["spec"]["volumes"]
        if v.get("emptyDir", {}).get("medium") == "Memory"
    )
    ranks = policy_of(text).job.nproc_per_node
    assert isinstance(ranks, int)
    assert memory_bytes(memory) == backed + ranks * qos.MEMORY_PER_RANK


def test_cpu_and_memory_flags_win() -> None:
    resources = trainer(objects_of(STARTER, ManifestOptions(cpu="90", memory="900Gi")))["resources"]
    assert resources["requests"] == {"nvidia.com/gpu": 8, "cpu": "90", "memory": "900Gi"}
    assert resources["limits"] == {"nvidia.com/gpu": 8, "memory": "900Gi"}
    only_cpu = trainer(objects_of(STARTER, ManifestOptions(cpu="500m")))["resources"]
    assert only_cpu["requests"]["cpu"] == "500m" and only_cpu["requests"]["memory"] == "144Gi"


def test_guaranteed_sets_every_limit_equal_to_its_request() -> None:
    objects = objects_of(with_control_store(STARTER), ManifestOptions(qos="guaranteed", efa=4))
    resources = trainer(objects)["resources"]
    assert (
        resources["requests"]
        == resources["limits"]
        == {
            "nvidia.com/gpu": 8,
            "vpc.amazonaws.com/efa": 4,
            "cpu": "16",
            "memory": "144Gi",
        }
    )
    control = control_pod(objects)["spec"]["containers"][0]["resources"]
    assert control == {"requests": qos.CONTROL_GUARANTEED, "limits": qos.CONTROL_GUARANTEED}
    for pod in pods(objects).values():
        assert qos_class(pod["spec"]) == "Guaranteed"
    explicit = trainer(objects_of(STARTER, ManifestOptions(qos="guaranteed", cpu="95500m", memory="1Ti")))
    assert explicit["resources"]["limits"]["cpu"] == "95500m"
    assert explicit["resources"]["limits"]["memory"] == "1Ti"


def test_the_control_pod_stays_burstable_by_default() -> None:
    spec = control_pod(objects_of(CONTROL))["spec"]
    assert spec["containers"][0]["resources"] == CONTROL_RESOURCES
    assert qos_class(spec) == "Burstable"


def test_unknown_ranks_request_nothing_by_default_and_say_so() -> None:
    """``nproc_per_node = "cpu"``: one rank per CPU core of a node that is not known yet."""
    policy = policy_of(CPU_RANKS)
    objects = render(policy, CPU_RANKS)
    assert "resources" not in trainer(objects)
    found = [n for n in notes(policy, ManifestOptions()) if "does not say how many ranks" in n]
    assert found == [
        '[job] nproc_per_node = "cpu" does not say how many ranks a pod runs, so no CPU and no '
        "memory is requested by default: the pods may be evicted first, and nothing reserves the "
        "memory of /dev/shm; pass --cpu and --memory"
    ]
    only_cpu = [n for n in notes(policy, ManifestOptions(cpu="8")) if "does not say" in n]
    assert only_cpu and only_cpu[0].endswith("pass --memory") and "no memory is requested" in only_cpu[0]
    assert not [n for n in notes(policy, ManifestOptions(cpu="8", memory="64Gi")) if "does not say" in n]
    with pytest.raises(UsageError, match="--qos guaranteed needs a CPU and a memory limit") as caught:
        render(policy, CPU_RANKS, ManifestOptions(qos="guaranteed", cpu="8"))
    assert "--cpu and --memory" in caught.value.fix
    sized = trainer(render(policy, CPU_RANKS, ManifestOptions(qos="guaranteed", cpu="8", memory="64Gi")))
    assert sized["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi"},
        "limits": {"cpu": "8", "memory": "64Gi"},
    }


def test_bad_qos_is_a_usage_error_naming_the_flag() -> None:
    with pytest.raises(UsageError, match=r"--qos 'besteffort' is not a QoS class") as caught:
        objects_of(MINIMAL, ManifestOptions(qos="besteffort"))
    assert caught.value.fix == "use --qos burstable or --qos guaranteed"


# -- Pod Security Standards ----------------------------------------------------------------------

_RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def pss_violations(spec: dict[str, Any], level: str) -> list[str]:
    """What breaks the Pod Security Standards ``level`` (baseline or restricted) in a pod
    ``spec``, by the rules of https://kubernetes.io/docs/concepts/security/pod-security-standards/
    for the fields a pod spec can hold."""
    found: list[str] = []
    pod_context = spec.get("securityContext", {})
    containers = containers_of(spec)
    contexts = [(c["name"], c.get("securityContext", {})) for c in containers]
    # -- baseline
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"{key}: true")
    for volume in spec.get("volumes", []):
        if "hostPath" in volume:
            found.append(f"hostPath volume {volume['name']}")
    for name, context in contexts:
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        added = set(context.get("capabilities", {}).get("add", []))
        if added - podsecurity.BASELINE_CAPABILITIES:
            found.append(f"{name}: adds {sorted(added - podsecurity.BASELINE_CAPABILITIES)}")
        if context.get("procMount", "Default") != "Default":
            found.append(f"{name}: procMount")
        if context.get("seccompProfile", {}).get("type") == "Unconfined":
            found.append(f"{name}: seccomp Unconfined")
        if context.get("appArmorProfile", {}).get("type") == "Unconfined":
            found.append(f"{name}: AppArmor Unconfined")
    for container in containers:
        for port in container.get("ports", []):
            if port.get("hostPort", 0):
                found.append(f"{container['name']}: hostPort {port['hostPort']}")
    if pod_context.get("seccompProfile", {}).get("type") == "Unconfined":
        found.append("pod: seccomp Unconfined")
    for sysctl in pod_context.get("sysctls", []):
        found.append(f"sysctl {sysctl['name']}")  # nvtrain sets none: any would need a look
    if level == "baseline":
        return found
    # -- restricted
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= _RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']} of type {sorted(kinds)}")
    pod_non_root = pod_context.get("runAsNonRoot") is True
    for name, context in contexts:
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{name}: capabilities.drop has no ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds {capabilities['add']}")
        non_root = context.get("runAsNonRoot", pod_non_root)
        if non_root is not True:
            found.append(f"{name}: runAsNonRoot is not true (pod or container)")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile is {seccomp}, not RuntimeDefault or Localhost")
    return found


PSS_CASES = {
    "job": (STARTER, ManifestOptions()),
    "control": (CONTROL, ManifestOptions()),
    "jobset-control": (JOBSET_CONTROL, ManifestOptions(jobset=True)),
    "metrics-volcano": (METRICS, ManifestOptions(scheduler_name="volcano", pod_monitor=True)),
    "host-copy-volume": (
        MINIMAL + 'nproc_per_node = 8\n[checkpoint]\nmemory_dir = "/hostcopy"\n',
        ManifestOptions(state_per_rank="1Gi", qos="guaranteed"),
    ),
}


@pytest.mark.parametrize("level", podsecurity.LEVELS)
@pytest.mark.parametrize("case", sorted(PSS_CASES))
def test_every_pod_passes_the_pod_security_level_asked_for(case: str, level: str) -> None:
    text, options = PSS_CASES[case]
    objects = load_all(dump(objects_of(text, dataclasses.replace(options, pod_security=level))))
    for name, pod in pods(objects).items():
        assert pss_violations(pod["spec"], level) == [], name
        assert pss_violations(pod["spec"], "baseline") == [], name


def test_the_checker_catches_what_each_level_forbids() -> None:
    """The checker is real: today's pods pass baseline but not restricted, RDMA's IPC_LOCK
    breaks baseline, and each restricted rule is checked."""
    plain = trainer(objects_of(STARTER))
    spec = pods(objects_of(STARTER))["my-training"]["spec"]
    assert pss_violations(spec, "baseline") == []
    assert any("runAsNonRoot" in v for v in pss_violations(spec, "restricted"))
    assert "securityContext" not in plain and "securityContext" not in spec
    rdma = pods(objects_of(STARTER, EFA))["my-training"]["spec"]
    assert pss_violations(rdma, "baseline") == ["trainer: adds ['IPC_LOCK']"]
    restricted = pods(objects_of(STARTER, ManifestOptions(pod_security="restricted")))["my-training"]["spec"]
    assert pss_violations(restricted, "restricted") == []
    for path, value, message in (
        (("securityContext", "runAsNonRoot"), False, "runAsNonRoot"),
        (("securityContext", "runAsUser"), 0, "runAsUser 0"),
        (("securityContext", "seccompProfile", "type"), "Unconfined", "seccomp"),
        (("containers", 0, "securityContext", "allowPrivilegeEscalation"), True, "allowPrivilegeEscalation"),
        (("containers", 0, "securityContext", "capabilities", "drop"), ["NET_RAW"], "drop has no ALL"),
        (("containers", 0, "securityContext", "capabilities", "add"), ["SYS_ADMIN"], "adds"),
        (("containers", 0, "securityContext", "privileged"), True, "privileged"),
        (("volumes", 0), {"name": "h", "hostPath": {"path": "/"}}, "hostPath"),
        (("hostNetwork",), True, "hostNetwork"),
    ):
        broken: Any = copy.deepcopy(restricted)
        target = broken
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        assert any(message in v for v in pss_violations(broken, "restricted")), path


def test_restricted_runs_every_pod_as_a_non_root_user_with_the_default_seccomp_profile() -> None:
    objects = objects_of(JOBSET_CONTROL, ManifestOptions(jobset=True, pod_security="restricted"))
    assert len(pods(objects)) == 2
    for pod in pods(objects).values():
        spec = pod["spec"]
        assert spec["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        for container in spec["containers"]:
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }
    assert podsecurity.DEFAULT_UID == 1000
    other = objects_of(STARTER, ManifestOptions(pod_security="restricted", run_as_user=4242))
    context = pods(other)["my-training"]["spec"]["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (4242, 4242, 4242)


def test_baseline_changes_nothing_but_refuses_rdma() -> None:
    assert objects_of(CONTROL, ManifestOptions(pod_security="baseline")) == objects_of(CONTROL)


def test_run_as_user_alone_sets_the_user_without_the_rest() -> None:
    spec = pods(objects_of(STARTER, ManifestOptions(run_as_user=2000)))["my-training"]["spec"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 2000,
        "runAsGroup": 2000,
        "fsGroup": 2000,
        "fsGroupChangePolicy": "OnRootMismatch",
    }
    assert "securityContext" not in spec["containers"][0]
    root = pods(objects_of(STARTER, ManifestOptions(run_as_user=0)))["my-training"]["spec"]
    assert root["securityContext"] == {"runAsUser": 0, "runAsGroup": 0}


@pytest.mark.parametrize("level", podsecurity.LEVELS)
@pytest.mark.parametrize(
    ("options", "flags"),
    [
        (EFA, "--efa 32"),
        (
            ManifestOptions(resources={"rdma/hca_shared_devices_a": 1}),
            "--resource rdma/hca_shared_devices_a=1",
        ),
        (ManifestOptions(efa=1, resources={"rdma/ib": 2}), "--efa 1 and --resource rdma/ib=2"),
    ],
)
def test_rdma_with_a_pod_security_level_is_refused_with_the_fix(
    options: ManifestOptions, flags: str, level: str
) -> None:
    with pytest.raises(UsageError) as caught:
        objects_of(STARTER, dataclasses.replace(options, pod_security=level))
    error = caught.value
    assert error.exit_code == 2
    assert str(error).startswith(f"{flags} gives the training container the IPC_LOCK capability")
    assert f"--pod-security {level} does not allow" in str(error)
    assert (
        "leave out --pod-security" in error.fix
        and "pod-security.kubernetes.io/enforce=privileged" in error.fix
    )


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (ManifestOptions(pod_security="privileged"), "--pod-security 'privileged' is not a Pod Security"),
        (ManifestOptions(pod_security="restricted", run_as_user=0), "--run-as-user 0 is root"),
        (ManifestOptions(run_as_user=-1), "--run-as-user -1 is not a user id"),
        (ManifestOptions(run_as_user=2**31), "is not a user id"),
    ],
)
def test_bad_pod_security_options_name_the_flag(options: ManifestOptions, match: str) -> None:
    with pytest.raises(UsageError, match=re.escape(match)) as caught:
        objects_of(MINIMAL, options)
    assert caught.value.fix


def test_the_starter_dockerfile_has_the_user_the_restricted_pods_run_as() -> None:
    text = starter_text("Dockerfile")
    assert f"ARG NVTRAIN_UID={podsecurity.DEFAULT_UID}" in text
    assert 'useradd --uid "${NVTRAIN_UID}"' in text and "--create-home" in text
    # It still runs as root by default (no USER line): a root-owned checkpoint volume stays writable.
    assert not re.search(r"^USER ", text, re.MULTILINE)


# -- scheduling ----------------------------------------------------------------------------------

SCHEDULED = ManifestOptions(
    tolerations=("dedicated=training:NoSchedule", "example.com/spot:NoExecute", "nvidia.com/gpu:NoSchedule"),
    priority_class="training-high",
    scheduler_name="my-scheduler",
    service_account="trainer",
    annotations={"example.com/owner": "ml team: a", "note": ""},
    ttl=86400,
)


def test_scheduling_options_reach_every_pod() -> None:
    objects = objects_of(CONTROL, SCHEDULED)
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    given = [
        {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"},
        {"key": "example.com/spot", "operator": "Exists", "effect": "NoExecute"},
    ]
    for name, pod in pods(objects).items():
        spec = pod["spec"]
        # The GPU pods' own toleration is not repeated; the control pod gets it from the flag.
        expected = [gpu, *given] if name == "llm-train" else [*given, gpu]
        assert spec["tolerations"] == expected, name
        assert spec["priorityClassName"] == "training-high"
        assert spec["schedulerName"] == "my-scheduler"
        assert spec["serviceAccountName"] == "trainer"
        assert spec["automountServiceAccountToken"] is False  # still no API token
        assert pod["metadata"]["annotations"] == {"example.com/owner": "ml team: a", "note": ""}
    for job in (o for o in objects if o["kind"] == "Job"):
        assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    assert not [o for o in objects if o["kind"] == "PodGroup"]  # only for volcano


def test_annotations_join_the_prometheus_ones_and_may_not_replace_nvtrains() -> None:
    objects = objects_of(METRICS, ManifestOptions(annotations={"team": "ml"}))
    annotations = pods(objects)["llm-train"]["metadata"]["annotations"]
    assert annotations["team"] == "ml" and annotations["prometheus.io/port"] == "9400"
    for key in (
        "prometheus.io/port",
        "batch.kubernetes.io/job-completion-index",
        "scheduling.k8s.io/group-name",
    ):
        with pytest.raises(UsageError, match=f"--annotation {re.escape(key)}=.*is set by nvtrain"):
            objects_of(METRICS, ManifestOptions(annotations={key: "x"}))


def test_ttl_of_the_jobset_is_the_jobsets_not_its_jobs() -> None:
    jobset = by_kind(objects_of(JOBSET_CONTROL, ManifestOptions(jobset=True, ttl=0)), "JobSet")
    assert jobset["spec"]["ttlSecondsAfterFinished"] == 0
    for replicated in jobset["spec"]["replicatedJobs"]:
        assert "ttlSecondsAfterFinished" not in replicated["template"]["spec"]
    assert all("ttlSecondsAfterFinished" not in o.get("spec", {}) for o in objects_of(CONTROL))


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("llm-train", "Always"),
        ("llm-train:latest", "Always"),
        ("registry.example.com:5000/ml/llm-train", "Always"),  # a port is not a tag
        ("registry.example.com:5000/ml/llm-train:latest", "Always"),
        ("registry.example.com:5000/ml/llm-train:1.2", "IfNotPresent"),
        ("llm-train:latest-rc", "IfNotPresent"),
        ("llm-train@sha256:" + "0" * 64, "IfNotPresent"),  # pinned by digest
        ("llm-train:latest@sha256:" + "0" * 64, "IfNotPresent"),
    ],
)
def test_image_pull_policy_is_always_only_for_latest_or_no_tag(image: str, policy: str) -> None:
    assert scheduling.pull_policy(image) == policy
    objects = objects_of(CONTROL, ManifestOptions(image=image))
    for pod in pods(objects).values():
        assert pod["spec"]["containers"][0]["imagePullPolicy"] == policy
    default = trainer(objects_of(MINIMAL))
    assert (default["image"], default["imagePullPolicy"]) == ("llm-train:latest", "Always")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            ManifestOptions(tolerations=("dedicated=training",)),
            "--toleration 'dedicated=training' is not KEY",
        ),
        (ManifestOptions(tolerations=(":NoSchedule",)), "is not KEY[=VALUE]:EFFECT"),
        (ManifestOptions(tolerations=("gpu:NoSchedul",)), "'NoSchedul' is not a taint effect"),
        (ManifestOptions(tolerations=("bad key:NoSchedule",)), "--toleration key 'bad key' is not valid"),
        (ManifestOptions(tolerations=("k=a b:NoSchedule",)), "the value 'a b' is not a taint value"),
        (ManifestOptions(priority_class="High"), "--priority-class 'High' is not a PriorityClass name"),
        (
            ManifestOptions(scheduler_name="my scheduler"),
            "--scheduler-name 'my scheduler' is not a scheduler",
        ),
        (
            ManifestOptions(service_account="Trainer_1"),
            "--service-account 'Trainer_1' is not a ServiceAccount",
        ),
        (ManifestOptions(annotations={"bad key": "x"}), "--annotation key 'bad key' is not valid"),
        (ManifestOptions(ttl=-1), "--ttl -1 is not a number of seconds"),
        (ManifestOptions(queue="Team A"), "--queue 'Team A' is not a queue name"),
        (ManifestOptions(queue="q" * 64), "longer than 63 characters"),
        (ManifestOptions(labels={"kueue.x-k8s.io/queue-name": "a"}), "queue-name would put every"),
        (ManifestOptions(pod_monitor=True), "--pod-monitor needs the policy's metrics endpoint"),
    ],
)
def test_bad_scheduling_options_name_the_flag_and_the_fix(options: ManifestOptions, match: str) -> None:
    with pytest.raises(UsageError, match=re.escape(match)) as caught:
        objects_of(MINIMAL, options)
    assert caught.value.exit_code == 2 and caught.value.fix


# -- Kueue ---------------------------------------------------------------------------------------


def test_queue_labels_the_workload_only() -> None:
    objects = objects_of(STARTER, ManifestOptions(queue="team-a"))
    for obj in objects:
        has = obj["metadata"]["labels"].get(scheduling.QUEUE_LABEL)
        assert has == ("team-a" if obj["kind"] == "Job" else None), obj["kind"]
    assert scheduling.QUEUE_LABEL not in pods(objects)["my-training"]["metadata"]["labels"]


def test_queue_with_the_control_store_needs_the_jobset() -> None:
    """Two Jobs are two Kueue workloads, admitted apart; a JobSet is one."""
    with pytest.raises(UsageError) as caught:
        objects_of(CONTROL, ManifestOptions(queue="team-a"))
    assert str(caught.value).startswith('--queue team-a with [rendezvous] store = "control" would queue')
    assert "join_timeout" in str(caught.value)
    assert caught.value.fix.startswith("add --jobset")
    objects = objects_of(JOBSET_CONTROL, ManifestOptions(jobset=True, queue="team-a"))
    assert [o["kind"] for o in objects] == ["ConfigMap", "NetworkPolicy", "JobSet"]
    assert by_kind(objects, "JobSet")["metadata"]["labels"][scheduling.QUEUE_LABEL] == "team-a"
    assert [
        o for o in objects if o["kind"] != "JobSet" and scheduling.QUEUE_LABEL in o["metadata"]["labels"]
    ] == []


def test_the_jobset_holds_the_control_pod_under_the_name_the_workers_dial() -> None:
    policy = policy_of(JOBSET_CONTROL)
    objects = render(policy, JOBSET_CONTROL, ManifestOptions(jobset=True))
    jobset = by_kind(objects, "JobSet")
    workers, control = jobset["spec"]["replicatedJobs"]
    assert (workers["name"], control["name"]) == ("workers", "control")
    assert control["replicas"] == 1
    spec = control["template"]["spec"]
    # NonIndexed: an Indexed Job (JobSet's default) would rename the pod <job>-0.
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("NonIndexed", 1, 1)
    pod = spec["template"]["spec"]
    # JobSet sets the subdomain to network.subdomain, its headless Service, which selects every
    # pod of the JobSet: <hostname>.<subdomain>.<namespace>.svc... is what nvtrain run dials.
    assert pod["subdomain"] == jobset["spec"]["network"]["subdomain"] == policy.service
    r = policy.rendezvous
    fqdn = f"{pod['hostname']}.{pod['subdomain']}.{r.namespace}.svc.{r.cluster_domain}"
    assert fqdn == control_name(policy)
    assert pod["containers"][0]["command"][:2] == ["nvtrain", "control"]
    # The NetworkPolicy selects it by the job's labels, as in the plain form.
    peers = by_kind(objects, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]
    assert peers.items() <= spec["template"]["metadata"]["labels"].items()
    # The same control pod as the plain Job's, but for the JobSet's completion mode.
    plain = by_kind(
        [o for o in objects_of(JOBSET_CONTROL) if o["metadata"]["name"].endswith("-control")], "Job"
    )
    assert {k: v for k, v in spec.items() if k != "completionMode"} == plain["spec"]
    assert [o["kind"] for o in objects] == ["ConfigMap", "NetworkPolicy", "JobSet"]


def test_a_replicated_job_named_control_cannot_hold_the_training_pods() -> None:
    text = with_control_store(starter_named("llm-control-0"))
    with pytest.raises(UsageError, match='adds the replicated job "control"') as caught:
        objects_of(text, ManifestOptions(jobset=True))
    assert 'name = "llm-workers-0"' in caught.value.fix


# -- Volcano -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "members"), [(CONTROL, 5), (STARTER, 2), (JOBSET_CONTROL, 3)])
def test_volcano_gets_a_pod_group_of_every_pod(text: str, members: int) -> None:
    jobset = text == JOBSET_CONTROL
    options = ManifestOptions(
        scheduler_name="volcano", queue="research", priority_class="high", jobset=jobset
    )
    objects = objects_of(text, options)
    policy = policy_of(text)
    group = by_kind(objects, "PodGroup")
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["metadata"]["name"] == policy.job.name
    assert group["metadata"]["namespace"] == policy.rendezvous.namespace
    resources = group["spec"].pop("minResources")
    assert group["spec"] == {"minMember": members, "queue": "research", "priorityClassName": "high"}
    # minResources: what every pod of the group requests, so Volcano admits all or none of it.
    gpus = policy.rendezvous.nodes * int(policy.job.nproc_per_node)
    assert resources["nvidia.com/gpu"] == str(gpus)
    cpu = sum(
        parse_quantity("cpu", str(c["resources"]["requests"]["cpu"]))
        * (1 if name.endswith("control") else policy.rendezvous.nodes)
        for name, pod in pods(objects).items()
        for c in pod["spec"]["containers"]
    )
    assert parse_quantity("cpu", resources["cpu"]) == cpu > 0
    assert parse_quantity("memory", resources["memory"]) > 0
    # Before the pods that name it; every pod, the control pod too, names it.
    kinds = [o["kind"] for o in objects]
    assert kinds.index("PodGroup") < min(kinds.index(k) for k in ("Job", "JobSet") if k in kinds)
    assert len(pods(objects)) == (2 if members != 2 else 1)
    for pod in pods(objects).values():
        assert pod["metadata"]["annotations"][scheduling.GROUP_ANNOTATION] == policy.job.name
        assert pod["spec"]["schedulerName"] == "volcano"
    # With Volcano the queue is the PodGroup's, not Kueue's.
    assert not [o for o in objects if scheduling.QUEUE_LABEL in o["metadata"]["labels"]]
    pod_count = sum((1 if n.endswith("control") else policy.rendezvous.nodes) for n in pods(objects))
    assert pod_count == members


def test_volcano_without_a_queue_uses_volcanos_default() -> None:
    group = by_kind(objects_of(MINIMAL, ManifestOptions(scheduler_name="volcano")), "PodGroup")
    assert group["spec"]["minMember"] == 1 and "queue" not in group["spec"]


# -- Prometheus Operator -------------------------------------------------------------------------


def test_pod_monitor_scrapes_the_named_metrics_port_of_the_training_pods() -> None:
    text = with_control_store(METRICS)
    objects = objects_of(text, ManifestOptions(pod_monitor=True, labels={"release": "kube-prometheus-stack"}))
    monitor = by_kind(objects, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # its Prometheus selects it
    assert monitor["metadata"]["namespace"] == "default"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector == by_kind(objects, "Service")["spec"]["selector"]
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics"}]
    ports = {p["name"]: p["containerPort"] for p in trainer(objects)["ports"]}
    assert ports["metrics"] == 9400
    # The control pod matches the selector but has no port named metrics: it is not scraped.
    control = control_pod(objects)
    assert selector.items() <= control["metadata"]["labels"].items()
    assert "metrics" not in {p["name"] for p in control["spec"]["containers"][0]["ports"]}
    assert not [o for o in objects_of(text) if o["kind"] == "PodMonitor"]


# -- schemas, golden files and the command line ---------------------------------------------------

EVERYTHING = ManifestOptions(
    image="registry.example.com/ml/llm:2",
    qos="guaranteed",
    pod_security="restricted",
    tolerations=("dedicated=training:NoSchedule",),
    priority_class="training-high",
    service_account="trainer",
    annotations={"example.com/owner": "ml"},
    ttl=3600,
    pod_monitor=True,
    labels={"release": "kube-prometheus-stack"},
)
PLATFORM_CASES = {
    "kueue-jobset-control": (
        with_control_store(set_keys(starter_named("llm-workers-0"), {("metrics", "enabled"): "true"})),
        dataclasses.replace(EVERYTHING, jobset=True, queue="team-a"),
    ),
    "volcano-control": (
        with_control_store(METRICS),
        dataclasses.replace(EVERYTHING, scheduler_name="volcano", queue="research"),
    ),
    "kueue-job": (STARTER, ManifestOptions(queue="team-a", ttl=60, run_as_user=1234)),
    "burstable-host-copies": (STARTER, ManifestOptions(state_per_rank="20Gi", shm_size="10G")),
    "cpu-ranks": (CPU_RANKS, ManifestOptions(qos="guaranteed", cpu="1500m", memory="64Gi")),
}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("case", sorted(PLATFORM_CASES))
def test_every_object_is_valid_against_its_schema(case: str, version: str) -> None:
    text, options = PLATFORM_CASES[case]
    objects = load_all(dump(objects_of(text, options)))
    errors = [e for o in objects for e in object_errors(o, version)]
    assert not errors, "\n".join(errors)


def test_the_crd_schemas_catch_a_broken_object() -> None:
    """The upstream CRD schemas (``crd_schemas``) refuse wrong types, unknown fields (as strict
    field validation does), values outside an enum, an apiVersion the CRD does not serve, and
    metadata that is not an ObjectMeta."""
    text, options = PLATFORM_CASES["volcano-control"]
    objects = objects_of(text, options)
    for kind, path, value in (
        ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "port"), 9400),
        ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "scheme"), "ftp"),
        ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "portt"), "metrics"),
        ("PodMonitor", ("metadata", "labels"), {"team": 7}),
        ("PodMonitor", ("apiVersion",), "monitoring.coreos.com/v1alpha1"),
        ("PodGroup", ("spec", "minMember"), "5"),
        ("PodGroup", ("spec", "minMembers"), 5),
    ):
        broken: Any = copy.deepcopy(by_kind(objects, kind))
        assert crd_errors(broken) == []
        target = broken
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        assert crd_errors(broken), (kind, path)


def test_golden_kueue_jobset_with_the_control_pod() -> None:
    text, options = PLATFORM_CASES["kueue-jobset-control"]
    check_golden("platform_kueue_jobset.yaml", dump(objects_of(text, options)))


def test_golden_volcano_with_the_control_pod() -> None:
    text, options = PLATFORM_CASES["volcano-control"]
    check_golden("platform_volcano.yaml", dump(objects_of(text, options)))


def test_every_platform_flag_reaches_the_objects(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(with_control_store(METRICS), encoding="utf-8")
    result = runner.invoke(
        app,
        [
            "manifest",
            str(policy),
            "--image=registry.example.com/ml/llm:2",
            "--qos=guaranteed",
            "--pod-security=restricted",
            "--run-as-user=2000",
            "--toleration=dedicated=training:NoSchedule",
            "--toleration=spot:NoExecute",
            "--priority-class=training-high",
            "--scheduler-name=volcano",
            "--queue=research",
            "--service-account=trainer",
            "--annotation=example.com/owner=ml=x",
            "--ttl=3600",
            "--pod-monitor",
        ],
    )
    assert result.exit_code == 0, result.output
    objects = load_all(result.stdout)
    expected = render(
        policy_of(with_control_store(METRICS)),
        with_control_store(METRICS),
        dataclasses.replace(
            PLATFORM_CASES["volcano-control"][1],
            run_as_user=2000,
            tolerations=("dedicated=training:NoSchedule", "spot:NoExecute"),
            annotations={"example.com/owner": "ml=x"},
            labels={},
        ),
    )
    assert objects == load_all(dump(expected))
    assert [o["kind"] for o in objects][-4:] == ["PodMonitor", "PodGroup", "Job", "Job"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--toleration", "gpu"], "--toleration 'gpu' is not KEY[=VALUE]:EFFECT"),
        (["--qos", "best"], "--qos 'best' is not a QoS class"),
        (["--pod-security", "restricted", "--efa", "4"], "--efa 4 gives the training container the IPC_LOCK"),
        (["--annotation", "novalue"], "--annotation 'novalue' is not KEY=VALUE"),
        (["--queue", "team-a"], '--queue team-a with [rendezvous] store = "control"'),
        (["--pod-monitor"], "--pod-monitor needs the policy's metrics endpoint"),
    ],
)
def test_bad_platform_flags_exit_2_with_a_fix(tmp_path: Path, args: list[str], message: str) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(CONTROL, encoding="utf-8")
    result = runner.invoke(app, ["manifest", str(policy), *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "fix:" in result.stderr
    assert result.stdout == "" and "Traceback" not in result.output

"""``nvtrain validate --manifest`` checks every reference the pods depend on
(``nvtrain.kube.manifest_refs``), and the rendering rules of issue 40's medium findings:
``--resource`` against ``--gpus`` and RDMA, backoff that grows with the pods, JobSet names that
the JobSet webhook accepts.

Each patch below is one that Kubernetes accepts and that breaks the job (or opens it); before
these checks ``validate --manifest --strict`` passed most of them. They are applied to the parsed
manifest, written back and checked through the library (milliseconds each); test_kustomize.py
does the same with the real ``kubectl kustomize``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
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
from nvtrain.findings import Finding
from nvtrain.kube import podsecurity
from nvtrain.kube.manifest import render
from nvtrain.kube.manifest_checks import check_manifest
from nvtrain.kube.options import ManifestOptions

POLICY = set_keys(starter_named("llm-train"), {("rendezvous", "nodes"): "4"})
JOBSET_POLICY = starter_named("llm-workers-0")
NCCL = set_keys(POLICY, {("job", "backend"): '"nccl"'})
POD = "spec.template.spec"
TRAINER = f"{POD}.containers[0]"
JOBSET_POD = "spec.replicatedJobs[0].template.spec.template.spec"

Doc = dict[str, Any]
runner = CliRunner()


def rendered(text: str = POLICY, options: ManifestOptions | None = None) -> list[Doc]:
    return render(policy_of(text), text, options or ManifestOptions())


def findings(tmp_path: Path, docs: list[Doc], text: str = POLICY) -> list[Finding]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    return check_manifest(path, policy_of(text), policy_text=text)


def kind(docs: list[Doc], wanted: str, index: int = -1) -> Doc:
    return [d for d in docs if d["kind"] == wanted][index]


def training(docs: list[Doc]) -> Doc:
    """The training pod template's spec (the plain Job's, or the JobSet's first replicated Job's)."""
    workload = docs[-1]
    if workload["kind"] == "JobSet":
        return workload["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return workload["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def trainer(docs: list[Doc]) -> Doc:
    return training(docs)["containers"][0]  # type: ignore[no-any-return]


# -- the patches ------------------------------------------------------------------------------


def configmap_ref(docs: list[Doc]) -> None:
    training(docs)["volumes"][0]["configMap"]["name"] = "llm-train-policy-old"


def subdomain(docs: list[Doc]) -> None:
    training(docs)["subdomain"] = "other"


def move_checkpoint_mount(docs: list[Doc]) -> None:
    trainer(docs)["volumeMounts"][1]["mountPath"] = "/mnt/elsewhere"


def drop_shm(docs: list[Doc]) -> None:
    trainer(docs)["volumeMounts"].pop(2)
    training(docs)["volumes"].pop(2)


def drop_failure_policy(docs: list[Doc]) -> None:
    del docs[-1]["spec"]["podFailurePolicy"]


def rename_container(docs: list[Doc]) -> None:
    trainer(docs)["name"] = "main"


def drop_run_id(docs: list[Doc]) -> None:
    trainer(docs)["env"] = [e for e in trainer(docs)["env"] if e["name"] != "NVTRAIN_RUN_ID"]


def run_id_per_pod(docs: list[Doc]) -> None:
    [entry] = [e for e in trainer(docs)["env"] if e["name"] == "NVTRAIN_RUN_ID"]
    entry["valueFrom"]["fieldRef"]["fieldPath"] = "metadata.name"


def other_command(docs: list[Doc]) -> None:
    trainer(docs)["command"] = ["torchrun", "--nproc-per-node=8", "train.py"]


def other_policy_path(docs: list[Doc]) -> None:
    trainer(docs)["command"] = ["nvtrain", "run", "/workspace/policy.toml"]


def fewer_gpus(docs: list[Doc]) -> None:
    for key in ("requests", "limits"):
        trainer(docs)["resources"][key]["nvidia.com/gpu"] = 4


def small_backoff(docs: list[Doc]) -> None:
    docs[-1]["spec"]["backoffLimit"] = 2


def mount_without_volume(docs: list[Doc]) -> None:
    training(docs)["volumes"][1]["name"] = "ckpt"


def relabel_pods(docs: list[Doc]) -> None:
    training(docs)  # the plain Job's pods
    docs[-1]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"] = "other"


def narrow_network_policy(docs: list[Doc]) -> None:
    kind(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]["team"] = "a"


def drop_peer_rule(docs: list[Doc]) -> None:
    kind(docs, "NetworkPolicy")["spec"]["ingress"] = [{"ports": [{"protocol": "TCP", "port": 9400}]}]


def service_selector(docs: list[Doc]) -> None:
    kind(docs, "Service")["spec"]["selector"]["app.kubernetes.io/name"] = "other"


PATCHES: list[tuple[Callable[[list[Doc]], None], str, set[tuple[str, str, str, str]]]] = [
    (
        configmap_ref,
        POLICY,
        {("error", "manifest-configmap", "Job llm-train", f"{POD}.volumes[0].configMap.name")},
    ),
    (subdomain, POLICY, {("error", "manifest-subdomain", "Job llm-train", f"{POD}.subdomain")}),
    (
        move_checkpoint_mount,
        POLICY,
        {("error", "manifest-mount", "Job llm-train", f"{TRAINER}.volumeMounts")},
    ),
    (drop_shm, POLICY, {("warning", "manifest-mount", "Job llm-train", f"{TRAINER}.volumeMounts")}),
    (
        drop_failure_policy,
        POLICY,
        {("warning", "manifest-failure-policy", "Job llm-train", "spec.podFailurePolicy")},
    ),
    (
        rename_container,
        POLICY,
        {
            (
                "error",
                "manifest-container",
                "Job llm-train",
                "spec.podFailurePolicy.rules[0].onExitCodes.containerName",
            )
        },
    ),
    (drop_run_id, POLICY, {("error", "manifest-run-id", "Job llm-train", f"{TRAINER}.env")}),
    (run_id_per_pod, POLICY, {("warning", "manifest-run-id", "Job llm-train", f"{TRAINER}.env[2]")}),
    (other_command, POLICY, {("warning", "manifest-command", "Job llm-train", f"{TRAINER}.command")}),
    (other_policy_path, POLICY, {("error", "manifest-command", "Job llm-train", f"{TRAINER}.command")}),
    (
        fewer_gpus,
        POLICY,
        {("error", "manifest-gpus", "Job llm-train", f'{TRAINER}.resources.limits["nvidia.com/gpu"]')},
    ),
    (small_backoff, POLICY, {("warning", "manifest-backoff", "Job llm-train", "spec.backoffLimit")}),
    (
        mount_without_volume,
        POLICY,
        {
            ("error", "manifest-volume", "Job llm-train", f"{TRAINER}.volumeMounts[1].name"),
        },
    ),
    (
        relabel_pods,
        POLICY,
        {
            ("error", "manifest-selector", "Service llm-train", "spec.selector"),
            ("error", "manifest-selector", "NetworkPolicy llm-train-peers", "spec.podSelector"),
        },
    ),
    (
        narrow_network_policy,
        POLICY,
        {("error", "manifest-selector", "NetworkPolicy llm-train-peers", "spec.podSelector")},
    ),
    (
        drop_peer_rule,
        POLICY,
        {("error", "manifest-selector", "NetworkPolicy llm-train-peers", "spec.ingress")},
    ),
    (
        service_selector,
        POLICY,
        {("error", "manifest-selector", "Service llm-train", "spec.selector")},
    ),
]


@pytest.mark.parametrize(
    ("patch", "text", "expected"), PATCHES, ids=[p[0].__name__.replace("_", "-") for p in PATCHES]
)
def test_a_patch_that_breaks_the_job_is_found(
    tmp_path: Path, patch: Callable[[list[Doc]], None], text: str, expected: set[tuple[str, str, str, str]]
) -> None:
    docs = rendered(text)
    assert findings(tmp_path, docs, text) == []
    patch(docs)
    found = findings(tmp_path, docs, text)
    assert {(f.severity, f.code, f.table, f.key) for f in found} == expected, [f.rule for f in found]
    for f in found:  # the file and line, the value, what goes wrong and what to do
        assert f.file == str(tmp_path / "job.yaml") and f.line is not None
        assert f.rule and f.fix
    result = runner.invoke(
        app, ["validate", "--nvrx", "0.7.0", "--manifest", str(tmp_path / "job.yaml"), "--strict"]
    )
    assert result.exit_code == (2 if any(f.severity == "error" for f in found) else 1), result.output


def test_the_messages_name_the_field_the_value_and_the_fix(tmp_path: Path) -> None:
    docs = rendered(NCCL)
    fewer_gpus(docs)
    [gpus] = findings(tmp_path, docs, NCCL)
    assert gpus.value == "4" and "local ranks 4 to 7 find no GPU" in gpus.rule
    assert "nvidia.com/gpu to 8" in gpus.fix
    docs = rendered()
    drop_run_id(docs)
    [run_id] = findings(tmp_path, docs)
    assert "every pod exits 2" in run_id.rule
    assert "metadata.labels['batch.kubernetes.io/controller-uid']" in run_id.fix
    docs = rendered()
    other_policy_path(docs)
    [command] = findings(tmp_path, docs)
    assert "/workspace/policy.toml" in command.rule and "/etc/nvtrain/policy.toml" in command.rule


def test_the_jobset_and_the_control_pod_are_checked_too(tmp_path: Path) -> None:
    text = with_control_store(JOBSET_POLICY)
    docs = rendered(text, ManifestOptions(jobset=True))
    assert findings(tmp_path, docs, text) == []
    [jobset] = [d for d in docs if d["kind"] == "JobSet"]
    control = jobset["spec"]["replicatedJobs"][1]["template"]["spec"]
    control["template"]["spec"]["volumes"][0]["configMap"]["name"] = "gone"
    control["podFailurePolicy"]["rules"][0]["onExitCodes"]["containerName"] = "store"
    drop_run_id(docs)
    found = {(f.severity, f.code, f.key) for f in findings(tmp_path, docs, text)}
    control_at = "spec.replicatedJobs[1].template.spec"
    assert found == {
        ("error", "manifest-configmap", f"{control_at}.template.spec.volumes[0].configMap.name"),
        ("error", "manifest-container", f"{control_at}.podFailurePolicy.rules[0].onExitCodes.containerName"),
        ("error", "manifest-run-id", f"{JOBSET_POD}.containers[0].env"),
    }


def test_a_volcano_pod_group_and_its_members_are_checked(tmp_path: Path) -> None:
    text = with_control_store(POLICY)
    docs = rendered(text, ManifestOptions(scheduler_name="volcano"))
    assert findings(tmp_path, docs, text) == []
    kind(docs, "PodGroup")["spec"]["minMember"] = 6  # 4 training pods + the control pod = 5
    [found] = findings(tmp_path, docs, text)
    assert (found.severity, found.code, found.key, found.value) == (
        "error",
        "manifest-podgroup",
        "spec.minMember",
        "6",
    )
    assert "5 pods" in found.rule and "Pending forever" in found.rule
    kind(docs, "PodGroup")["spec"]["minMember"] = 5
    annotations = docs[-1]["spec"]["template"]["metadata"]["annotations"]
    annotations["scheduling.k8s.io/group-name"] = "llm-train-old"
    codes = {(f.severity, f.code, f.table) for f in findings(tmp_path, docs, text)}
    assert codes == {
        ("error", "manifest-podgroup", "Job llm-train"),
        ("error", "manifest-podgroup", "PodGroup llm-train"),  # only the control pod names it
    }
    del annotations["scheduling.k8s.io/group-name"]
    codes = {(f.severity, f.code, f.table) for f in findings(tmp_path, docs, text)}
    assert codes == {
        ("warning", "manifest-podgroup", "Job llm-train"),
        ("error", "manifest-podgroup", "PodGroup llm-train"),  # 1 member for 5
    }


def test_a_pod_monitor_that_selects_no_pod_warns(tmp_path: Path) -> None:
    text = set_keys(POLICY, {("metrics", "enabled"): "true"})
    docs = rendered(text, ManifestOptions(pod_monitor=True))
    assert findings(tmp_path, docs, text) == []
    kind(docs, "PodMonitor")["spec"]["selector"]["matchLabels"]["team"] = "a"
    [found] = findings(tmp_path, docs, text)
    assert (found.severity, found.code, found.table) == (
        "warning",
        "manifest-selector",
        "PodMonitor llm-train",
    )


def test_a_wrapper_script_that_execs_nvtrain_run_is_accepted(tmp_path: Path) -> None:
    docs = rendered()
    trainer(docs)["command"] = ["bash", "-c", "ulimit -n 65536 && exec nvtrain run /etc/nvtrain/policy.toml"]
    assert findings(tmp_path, docs) == []


@pytest.mark.parametrize(
    ("text", "options"),
    [
        (POLICY, ManifestOptions()),
        (with_control_store(POLICY), ManifestOptions(scheduler_name="volcano", queue="q")),
        (with_control_store(JOBSET_POLICY), ManifestOptions(jobset=True, scheduler_name="volcano")),
        (NCCL, ManifestOptions(kubernetes="1.33", efa=4, rdma_resources={"example.com/ib": 1})),
        (
            set_keys(POLICY, {("job", "nproc_per_node"): "1"}),
            ManifestOptions(
                gpus_per_node=0, resources={"nvidia.com/mig-3g.40gb": 1}, pod_security="restricted"
            ),
        ),
    ],
    ids=["job", "volcano-control", "volcano-jobset", "per-index-rdma", "mig-restricted"],
)
def test_every_rendered_variant_passes_the_reference_checks(
    tmp_path: Path, text: str, options: ManifestOptions
) -> None:
    assert findings(tmp_path, rendered(text, options), text) == []


# -- --resource: no silent GPU override, IPC_LOCK only for RDMA ----------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ManifestOptions(resources={"nvidia.com/gpu": 4}),
            "--resource nvidia.com/gpu=4 would replace what --gpus sets",
        ),
        (ManifestOptions(resources={"vpc.amazonaws.com/efa": 4}), "use --efa 4 instead"),
        (ManifestOptions(rdma_resources={"nvidia.com/gpu": 1}), "--rdma-resource nvidia.com/gpu=1"),
        (
            ManifestOptions(resources={"rdma/ib": 1}, rdma_resources={"rdma/ib": 1}),
            "both --resource and --rdma-resource",
        ),
    ],
)
def test_a_resource_that_nvtrain_sets_itself_is_refused(options: ManifestOptions, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        rendered(NCCL, options)
    assert message in f"{caught.value.message} {caught.value.fix}"


def test_a_mig_slice_is_not_rdma_and_stays_restricted() -> None:
    text = set_keys(POLICY, {("job", "nproc_per_node"): "1"})
    options = ManifestOptions(
        gpus_per_node=0, resources={"nvidia.com/mig-1g.10gb": 1}, pod_security="restricted"
    )
    container = trainer(rendered(text, options))
    assert container["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == 1
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert container["securityContext"] == podsecurity.container_context("restricted", rdma=False)
    assert training(rendered(text, options))["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_rdma_is_said_by_the_name_or_by_rdma_resource() -> None:
    named = trainer(rendered(NCCL, ManifestOptions(resources={"rdma/hca_shared_devices_a": 1})))
    assert named["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    told = trainer(rendered(NCCL, ManifestOptions(rdma_resources={"example.com/roce": 2})))
    assert told["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert told["resources"]["limits"]["example.com/roce"] == 2
    plain = trainer(rendered(NCCL, ManifestOptions(resources={"example.com/fpga": 1})))
    assert "securityContext" not in plain
    with pytest.raises(UsageError, match="--rdma-resource example.com/roce=2"):
        rendered(NCCL, ManifestOptions(rdma_resources={"example.com/roce": 2}, pod_security="restricted"))


# -- backoff that grows with the pods ---------------------------------------------------------------


def test_the_backoff_limit_grows_with_the_pods() -> None:
    text = set_keys(POLICY, {("rendezvous", "nodes"): "16"})
    spec = rendered(text)[-1]["spec"]
    assert spec["backoffLimit"] == 6 * 16  # one wave of 16 failures leaves 5 more
    assert "backoffLimitPerIndex" not in spec and "maxFailedIndexes" not in spec
    assert rendered(text, ManifestOptions(backoff_limit=2))[-1]["spec"]["backoffLimit"] == 32
    control = with_control_store(text)
    [store] = [d for d in rendered(control) if d["metadata"]["name"] == "llm-train-control"]
    assert store["spec"]["backoffLimit"] == 6  # one pod


@pytest.mark.parametrize("version", ["1.33", "1.35", "v1.40.2"])
def test_from_kubernetes_1_33_each_index_has_its_own_retries(version: str) -> None:
    for text, options in (
        (POLICY, ManifestOptions(kubernetes=version)),
        (JOBSET_POLICY, ManifestOptions(kubernetes=version, jobset=True)),
    ):
        workload = rendered(text, options)[-1]
        spec = (
            workload["spec"]
            if workload["kind"] == "Job"
            else workload["spec"]["replicatedJobs"][0]["template"]["spec"]
        )
        nodes = spec["completions"]
        assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"], spec["backoffLimit"]) == (
            6,
            0,
            6 * nodes,
        )
        assert object_errors(workload, KUBERNETES_VERSIONS[-1]) == []


@pytest.mark.parametrize(
    ("version", "message"), [("1.27", "older than the oldest"), ("latest", "not a Kubernetes version")]
)
def test_a_kubernetes_version_that_cannot_be_used_is_refused(version: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        rendered(POLICY, ManifestOptions(kubernetes=version))


def test_the_cli_passes_kubernetes_and_rdma_resource(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(NCCL, encoding="utf-8")
    result = runner.invoke(
        app,
        ["manifest", str(policy), "--kubernetes", "1.33", "--rdma-resource", "example.com/roce=1"],
    )
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert docs[-1]["spec"]["backoffLimitPerIndex"] == 6
    assert trainer(docs)["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    result = runner.invoke(app, ["manifest", str(policy), "--resource", "nvidia.com/gpu=4"])
    assert result.exit_code == 2 and "use --gpus 4 instead" in result.output


# -- names the JobSet webhook accepts ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "nodes", "message"),
    [
        ("1llm-workers-0", 2, 'the JobSet name "1llm" does not start with a letter'),
        ("llm-" + "y2" * 20 + "x-workers-0", 16, "is 64 characters"),
    ],
    ids=["digit", "long"],
)
def test_a_jobset_the_webhook_refuses_is_not_rendered(name: str, nodes: int, message: str) -> None:
    # [rendezvous] service of its own: a Service name must start with a letter too.
    text = set_keys(
        starter_named(name), {("rendezvous", "nodes"): str(nodes), ("rendezvous", "service"): '"peers"'}
    )
    with pytest.raises(UsageError, match="--jobset") as caught:
        rendered(text, ManifestOptions(jobset=True))
    assert message in f"{caught.value.message} {caught.value.fix}"
    ok = set_keys(starter_named("llm-" + "y2" * 20 + "-workers-0"), {("rendezvous", "nodes"): "16"})
    assert rendered(ok, ManifestOptions(jobset=True))[-1]["kind"] == "JobSet"  # 63 with the suffix


def test_validate_reports_jobset_names_the_webhook_refuses(tmp_path: Path) -> None:
    docs = rendered(JOBSET_POLICY, ManifestOptions(jobset=True))
    kind(docs, "JobSet")["metadata"]["name"] = "9llm"
    codes = {(f.severity, f.code, f.key) for f in findings(tmp_path, docs, JOBSET_POLICY)}
    assert ("error", "manifest-jobset-name", "metadata.name") in codes
    docs = rendered(JOBSET_POLICY, ManifestOptions(jobset=True))
    kind(docs, "JobSet")["metadata"]["name"] = "llm" + "-long" * 11
    codes = {(f.severity, f.code, f.key) for f in findings(tmp_path, docs, JOBSET_POLICY)}
    assert ("error", "manifest-jobset-name", "spec.replicatedJobs[0].name") in codes


def test_options_keep_their_meaning_elsewhere() -> None:
    # --resource with a name that is not RDMA renders as before, apart from the capability.
    options = ManifestOptions(resources={"example.com/fpga": 2})
    plain = dataclasses.replace(options, resources={})
    a, b = trainer(rendered(NCCL, options)), trainer(rendered(NCCL, plain))
    assert {k: v for k, v in a["resources"]["limits"].items() if k != "example.com/fpga"} == b["resources"][
        "limits"
    ]


def test_a_network_policy_of_the_users_own_is_left_alone(tmp_path: Path) -> None:
    docs = rendered()
    own = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "allow-dns", "namespace": "default"},
        "spec": {"podSelector": {"matchLabels": {"role": "dns"}}, "policyTypes": ["Egress"]},
    }
    assert findings(tmp_path, [*docs[:-1], own, docs[-1]]) == []
    own["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "nvtrain"}  # type: ignore[index]
    codes = {(f.code, f.table) for f in findings(tmp_path, [*docs[:-1], own, docs[-1]])}
    assert codes == {("manifest-selector", "NetworkPolicy allow-dns")}


@pytest.mark.parametrize(
    ("command", "codes"),
    [
        (["nvtrain", "run", "--run-id", "x1", "/etc/nvtrain/policy.toml"], set()),
        (["nvtrain", "run", "--policy=/etc/nvtrain/policy.toml", "train.py"], set()),
        (["/usr/local/bin/nvtrain", "run", "--policy", "/opt/p.toml", "train.py"], {"manifest-command"}),
        (["sh", "-c", "exec nvtrain run /etc/nvtrain/old.toml"], {"manifest-command"}),
    ],
)
def test_the_policy_file_is_found_among_the_options(
    tmp_path: Path, command: list[str], codes: set[str]
) -> None:
    docs = rendered()
    trainer(docs)["command"] = command
    assert {f.code for f in findings(tmp_path, docs)} == codes

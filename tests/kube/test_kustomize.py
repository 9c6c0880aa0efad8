"""A rendered manifest renamed by Kustomize, with the real ``kubectl kustomize``.

The kustomization of docs/kubernetes.md ("Kustomize") is taken from the page as written, applied
to what ``nvtrain manifest`` renders, and the result must pass ``nvtrain validate --manifest
--strict``; without its ``nameReference`` configuration the Service is renamed and the pods'
``subdomain`` is not, which ``validate`` must report as an error. The fields used are kept to what
Kustomize 2.0.3 (kubectl 1.14 to 1.20) has, so the same files work with Debian's kubectl.
Skipped where ``kubectl`` is not installed; with ``NVTRAIN_KUBECTL=require`` (CI sets it) that
fails instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from templates_helpers import policy_of, starter_named, starter_two_nodes, with_control_store
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.launcher.identity import identify

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")
if KUBECTL is None and os.environ.get("NVTRAIN_KUBECTL", "").strip().lower() == "require":
    raise RuntimeError(
        "NVTRAIN_KUBECTL=require but kubectl is not installed (apt-get install kubernetes-client)"
    )
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

runner = CliRunner()


def documented_files() -> dict[str, str]:
    """The YAML blocks of the "Kustomize" section whose first line is ``# <file name>``."""
    page = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    section = page.split("\n## Kustomize\n", 1)[1].split("\n## ", 1)[0]
    files = {}
    for block in re.findall(r"```yaml\n(.*?)```", section, re.DOTALL):
        name = re.match(r"# ([\w.-]+\.yaml)", block)
        assert name, f"a yaml block of the Kustomize section does not start with '# <file>': {block!r}"
        files[name.group(1)] = block
    assert set(files) == {"kustomization.yaml", "nvtrain-names.yaml"}, sorted(files)
    return files


def render(directory: Path, policy_text: str, *args: str) -> None:
    """``nvtrain manifest`` of ``policy_text`` into ``directory/job.yaml``."""
    directory.mkdir(parents=True)
    policy = directory.parent / f"{directory.name}.toml"
    policy.write_text(policy_text, encoding="utf-8")
    result = runner.invoke(
        app, ["manifest", str(policy), "--nvrx", "0.7.0", "-o", str(directory / "job.yaml"), *args]
    )
    assert result.exit_code == 0, result.output


def kustomize(directory: Path, kustomization: str, extra: dict[str, str] | None = None) -> Path:
    """``kubectl kustomize directory`` with these files; the output's path."""
    (directory / "kustomization.yaml").write_text(kustomization, encoding="utf-8")
    for name, text in (extra or {}).items():
        (directory / name).write_text(text, encoding="utf-8")
    assert KUBECTL is not None
    proc = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = directory.parent / f"{directory.name}.yaml"
    out.write_text(proc.stdout, encoding="utf-8")
    return out


def validate(manifest: Path) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["validate", "--manifest", str(manifest), "--strict", "--json"])
    assert "Traceback" not in result.output
    return result.exit_code, json.loads(result.stdout)


def objects(manifest: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(manifest.read_text(encoding="utf-8")) if d]


def without_configuration(kustomization: str) -> str:
    """The documented kustomization without its ``configurations`` (what most people write)."""
    naive = re.sub(r"configurations:\n(- .*\n)+", "", kustomization)
    assert "configurations" not in naive and "namePrefix: exp1-" in naive
    return naive


STARTER = starter_two_nodes()


def test_the_documented_kustomization_renames_the_subdomain_with_the_service(tmp_path: Path) -> None:
    files = documented_files()
    render(tmp_path / "exp1", STARTER)
    out = kustomize(
        tmp_path / "exp1", files["kustomization.yaml"], {"nvtrain-names.yaml": files["nvtrain-names.yaml"]}
    )
    docs = objects(out)
    [service] = [d for d in docs if d["kind"] == "Service"]
    [job] = [d for d in docs if d["kind"] == "Job"]
    assert service["metadata"]["name"] == job["spec"]["template"]["spec"]["subdomain"] == "exp1-my-training"
    assert job["metadata"]["name"] == "exp1-my-training"
    assert {d["metadata"]["namespace"] for d in docs} == {"team-a"}
    code, data = validate(out)
    assert code == 0, data["findings"]
    assert (data["errors"], data["warnings"], data["nvrx"]) == (0, 0, "0.7.0")
    renamed = {f["key"] for f in data["findings"] if f["code"] == "manifest-renamed"}
    assert renamed == {"metadata.namespace", "spec.template.spec.subdomain"}

    # What pod 1 of that Job finds in its own hostname and /etc/hosts names pod 0 under this Service.
    hostname = f"{job['metadata']['name']}-1"
    fqdn = f"{hostname}.{job['spec']['template']['spec']['subdomain']}.team-a.svc.cluster.local"
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1\tlocalhost\n10.4.0.9\t{fqdn}\t{hostname}\n", encoding="utf-8")
    env = {"JOB_COMPLETION_INDEX": "1", "NVTRAIN_RUN_ID": "uid"}
    found = identify(policy_of(STARTER), env, hostname=hostname, hosts_file=hosts)
    assert found.names is not None
    assert found.names.pod(0) == "exp1-my-training-0.exp1-my-training.team-a.svc.cluster.local"


def test_without_the_configuration_the_subdomain_is_an_error(tmp_path: Path) -> None:
    render(tmp_path / "naive", STARTER)
    out = kustomize(tmp_path / "naive", without_configuration(documented_files()["kustomization.yaml"]))
    code, data = validate(out)
    assert code == 2
    errors = [f for f in data["findings"] if f["severity"] == "error"]
    assert [(f["code"], f["table"], f["key"], f["value"]) for f in errors] == [
        ("manifest-subdomain", "Job exp1-my-training", "spec.template.spec.subdomain", '"my-training"')
    ]
    assert "exp1-my-training" in errors[0]["rule"] and "nameReference" in errors[0]["fix"]
    line = out.read_text(encoding="utf-8").splitlines()[errors[0]["line"] - 1]
    assert line.strip() == "subdomain: my-training"


def test_the_control_job_follows_the_service_too(tmp_path: Path) -> None:
    files = documented_files()
    policy = with_control_store(STARTER)
    render(tmp_path / "exp1", policy)
    out = kustomize(
        tmp_path / "exp1", files["kustomization.yaml"], {"nvtrain-names.yaml": files["nvtrain-names.yaml"]}
    )
    jobs = {d["metadata"]["name"]: d for d in objects(out) if d["kind"] == "Job"}
    assert set(jobs) == {"exp1-my-training", "exp1-my-training-control"}
    control = jobs["exp1-my-training-control"]["spec"]["template"]["spec"]
    assert (control["hostname"], control["subdomain"]) == ("my-training-control", "exp1-my-training")
    code, data = validate(out)
    assert code == 0, data["findings"]

    render(tmp_path / "naive", policy)
    out = kustomize(tmp_path / "naive", without_configuration(files["kustomization.yaml"]))
    code, data = validate(out)
    assert code == 2
    assert sorted((f["code"], f["table"]) for f in data["findings"] if f["severity"] == "error") == [
        ("manifest-subdomain", "Job exp1-my-training"),
        ("manifest-subdomain", "Job exp1-my-training-control"),
    ]


@pytest.mark.parametrize(
    "change",
    [
        "nameSuffix: -v2\n",
        "commonLabels:\n  nvtrain.dev/experiment: exp1\n",
    ],
    ids=["name-suffix", "common-labels"],
)
def test_other_kustomize_2_fields_keep_it_valid(tmp_path: Path, change: str) -> None:
    files = documented_files()
    render(tmp_path / "exp1", STARTER)
    out = kustomize(
        tmp_path / "exp1",
        files["kustomization.yaml"] + change,
        {"nvtrain-names.yaml": files["nvtrain-names.yaml"]},
    )
    code, data = validate(out)
    assert code == 0, data["findings"]


def configured(directory: Path, kustomization: str) -> Path:
    """``kubectl kustomize`` with ``kustomization`` and the documented nvtrain-names.yaml."""
    files = documented_files()
    return kustomize(directory, kustomization, {"nvtrain-names.yaml": files["nvtrain-names.yaml"]})


def errors_of(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted((f["code"], f["table"], f["key"]) for f in data["findings"] if f["severity"] == "error")


JOBSET = starter_named("llm-workers-0")
JOBSET_VOLUME = "spec.replicatedJobs[0].template.spec.template.spec.volumes[0].configMap.name"
EXPERIMENT = "commonLabels:\n  nvtrain.dev/experiment: exp1\n"


def pod_templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] == "JobSet":
        return [rj["template"]["spec"]["template"] for rj in doc["spec"]["replicatedJobs"]]
    return [doc["spec"]["template"]]


def test_a_prefixed_jobset_mounts_its_renamed_configmap(tmp_path: Path) -> None:
    # High finding 1: Kustomize renames the ConfigMap but not its reference inside the JobSet.
    render(tmp_path / "naive", JOBSET, "--jobset")
    out = kustomize(tmp_path / "naive", without_configuration(documented_files()["kustomization.yaml"]))
    [configmap] = [d["metadata"]["name"] for d in objects(out) if d["kind"] == "ConfigMap"]
    assert configmap.startswith("exp1-llm-workers-0-policy-")
    code, data = validate(out)
    assert code == 2
    assert errors_of(data) == [("manifest-configmap", "JobSet exp1-llm", JOBSET_VOLUME)]
    [error] = [f for f in data["findings"] if f["code"] == "manifest-configmap"]
    assert error["value"] == json.dumps(configmap.removeprefix("exp1-"))
    assert configmap in error["rule"] and "ContainerCreating" in error["rule"]
    assert "nvtrain-names.yaml" in error["fix"]

    render(tmp_path / "exp1", with_control_store(JOBSET), "--jobset")
    out = configured(tmp_path / "exp1", documented_files()["kustomization.yaml"])
    [jobset] = [d for d in objects(out) if d["kind"] == "JobSet"]
    [configmap] = [d["metadata"]["name"] for d in objects(out) if d["kind"] == "ConfigMap"]
    for template in pod_templates(jobset):  # the training pods and the control pod
        assert template["spec"]["volumes"][0]["configMap"]["name"] == configmap
    code, data = validate(out)
    assert code == 0, data["findings"]


def test_common_labels_on_a_jobset_keep_the_network_policy_covering_the_pods(tmp_path: Path) -> None:
    # High finding 2: commonLabels reach the NetworkPolicy's selectors but not the JobSet's pods.
    naive = "resources:\n- job.yaml\n" + EXPERIMENT
    render(tmp_path / "naive", with_control_store(JOBSET), "--jobset")
    out = kustomize(tmp_path / "naive", naive)
    [policy] = [d for d in objects(out) if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"]["nvtrain.dev/experiment"] == "exp1"
    code, data = validate(out)
    assert code == 2
    assert errors_of(data) == [("manifest-selector", "NetworkPolicy llm-workers-0-peers", "spec.podSelector")]
    [error] = [f for f in data["findings"] if f["severity"] == "error"]
    assert "open to every pod of the cluster" in error["rule"]
    assert "training pods of JobSet llm" in error["rule"] and "control pod" in error["rule"]

    render(tmp_path / "exp1", with_control_store(JOBSET), "--jobset")
    out = configured(tmp_path / "exp1", documented_files()["kustomization.yaml"] + EXPERIMENT)
    [jobset] = [d for d in objects(out) if d["kind"] == "JobSet"]
    for template in pod_templates(jobset):
        assert template["metadata"]["labels"]["nvtrain.dev/experiment"] == "exp1"
    code, data = validate(out)
    assert code == 0, data["findings"]


def test_a_prefixed_volcano_job_names_its_renamed_pod_group(tmp_path: Path) -> None:
    # High finding 3: the PodGroup is renamed, the pods' group annotation is not.
    files = documented_files()
    naive = files["kustomization.yaml"].replace("nvtrain-names.yaml", "services-only.yaml")
    services_only = files["nvtrain-names.yaml"].split("- kind: ConfigMap", 1)[0]  # the old recipe
    policy = with_control_store(STARTER)
    render(tmp_path / "naive", policy, "--scheduler-name", "volcano")
    out = kustomize(tmp_path / "naive", naive, {"services-only.yaml": services_only})
    code, data = validate(out)
    assert code == 2
    annotation = 'spec.template.metadata.annotations["scheduling.k8s.io/group-name"]'
    assert errors_of(data) == [
        ("manifest-podgroup", "Job exp1-my-training", annotation),
        ("manifest-podgroup", "Job exp1-my-training-control", annotation),
    ]
    assert all("exp1-my-training" in f["rule"] for f in data["findings"] if f["code"] == "manifest-podgroup")

    for args, name in (([], "vol"), (["--jobset"], "vol-js")):
        text = with_control_store(JOBSET) if args else policy
        render(tmp_path / name, text, "--scheduler-name", "volcano", *args)
        out = configured(tmp_path / name, files["kustomization.yaml"] + EXPERIMENT)
        [group] = [d["metadata"]["name"] for d in objects(out) if d["kind"] == "PodGroup"]
        assert group.startswith("exp1-")
        for doc in objects(out):
            if doc["kind"] in ("Job", "JobSet"):
                for template in pod_templates(doc):
                    assert template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == group
        code, data = validate(out)
        assert code == 0, data["findings"]


def test_a_prefix_the_jobset_webhook_refuses_is_an_error(tmp_path: Path) -> None:
    render(tmp_path / "digit", JOBSET, "--jobset")
    kustomization = documented_files()["kustomization.yaml"].replace("namePrefix: exp1-", "namePrefix: 1-")
    out = configured(tmp_path / "digit", kustomization)
    code, data = validate(out)
    assert code == 2
    assert errors_of(data) == [("manifest-jobset-name", "JobSet 1-llm", "metadata.name")]

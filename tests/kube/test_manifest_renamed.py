"""``nvtrain validate --manifest`` on manifests renamed by hand, as Kustomize would rename them:
what the pods survive is an info, what they cannot survive an error. (test_kustomize.py does the
same with the real ``kubectl kustomize``; these need no kubectl.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from templates_helpers import starter_named, starter_two_nodes, with_control_store
from typer.testing import CliRunner

from nvtrain.cli import app

runner = CliRunner()
STARTER = starter_two_nodes()  # [job] name and [rendezvous] service "my-training"

Docs = list[dict[str, Any]]


def rendered(tmp_path: Path, text: str = STARTER, *args: str) -> tuple[Path, Docs]:
    policy = tmp_path / "policy.toml"
    policy.write_text(text, encoding="utf-8")
    out = tmp_path / "job.yaml"
    result = runner.invoke(app, ["manifest", str(policy), "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    return out, list(yaml.safe_load_all(out.read_text(encoding="utf-8")))


def check(tmp_path: Path, docs: Docs, *, with_policy: bool = True) -> tuple[int, list[dict[str, Any]]]:
    """Write ``docs`` back and validate them (against policy.toml, or the manifest's own policy)."""
    out = tmp_path / "job.yaml"
    out.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    policy = [str(tmp_path / "policy.toml")] if with_policy else []
    result = runner.invoke(
        app, ["validate", *policy, "--manifest", str(out), "--nvrx", "0.7.0", "--strict", "--json"]
    )
    assert "Traceback" not in result.output
    findings = [f for f in json.loads(result.stdout)["findings"] if f["file"] == str(out)]
    return result.exit_code, findings


def codes(findings: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    return {(f["severity"], f["code"], f["table"], f["key"]) for f in findings}


def of_kind(docs: Docs, kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def prefix(docs: Docs, text: str = "exp1-", namespace: str | None = "team-a", subdomain: bool = True) -> None:
    """What Kustomize's namePrefix (with the configuration of docs/kubernetes.md when
    ``subdomain``) and namespace do to the objects nvtrain renders."""
    for doc in docs:
        doc["metadata"]["name"] = text + doc["metadata"]["name"]
        if namespace is not None:
            doc["metadata"]["namespace"] = namespace
        if doc["kind"] == "Job":
            pod = doc["spec"]["template"]["spec"]
            for volume in pod["volumes"]:
                if "configMap" in volume:
                    volume["configMap"]["name"] = text + volume["configMap"]["name"]
            if subdomain:
                pod["subdomain"] = text + pod["subdomain"]
        if doc["kind"] == "JobSet" and subdomain:  # the configuration also renames its ConfigMap
            for replicated in doc["spec"]["replicatedJobs"]:
                for volume in replicated["template"]["spec"]["template"]["spec"]["volumes"]:
                    if "configMap" in volume:
                        volume["configMap"]["name"] = text + volume["configMap"]["name"]


@pytest.mark.parametrize("with_policy", [True, False])
def test_a_prefix_and_namespace_the_pods_survive_are_infos(tmp_path: Path, with_policy: bool) -> None:
    _, docs = rendered(tmp_path)
    prefix(docs)
    code, found = check(tmp_path, docs, with_policy=with_policy)
    assert code == 0, found
    assert codes(found) == {
        ("info", "manifest-renamed", "Job exp1-my-training", "metadata.namespace"),
        ("info", "manifest-renamed", "Job exp1-my-training", "spec.template.spec.subdomain"),
    }


def test_a_subdomain_left_behind_is_an_error(tmp_path: Path) -> None:
    _, docs = rendered(tmp_path)
    prefix(docs, subdomain=False)
    code, found = check(tmp_path, docs)
    assert code == 2
    [error] = [f for f in found if f["severity"] == "error"]
    assert (error["code"], error["key"], error["value"]) == (
        "manifest-subdomain",
        "spec.template.spec.subdomain",
        '"my-training"',
    )
    assert "Services: exp1-my-training" in error["rule"] and "exits 3" in error["rule"]


def test_without_any_service_the_subdomain_is_compared_with_the_policy_only(tmp_path: Path) -> None:
    # A file without a Service may be one part of a larger set: no error, the old warning.
    _, docs = rendered(tmp_path)
    docs = [d for d in docs if d["kind"] != "Service"]
    of_kind(docs, "Job")[0]["spec"]["template"]["spec"]["subdomain"] = "elsewhere"
    code, found = check(tmp_path, docs)
    assert code == 1
    assert codes(found) == {
        ("warning", "manifest-mismatch", "Job my-training", "spec.template.spec.subdomain")
    }


def test_objects_in_different_namespaces_are_an_error_on_the_odd_one(tmp_path: Path) -> None:
    _, docs = rendered(tmp_path)
    of_kind(docs, "Service")[0]["metadata"]["namespace"] = "team-b"
    code, found = check(tmp_path, docs)
    assert code == 2
    assert codes(found) == {("error", "manifest-namespace", "Service my-training", "metadata.namespace")}
    [error] = found
    assert error["value"] == '"team-b"' and 'objects ("default")' in error["rule"]


def test_the_job_in_another_namespace_than_the_rest(tmp_path: Path) -> None:
    _, docs = rendered(tmp_path)
    of_kind(docs, "Job")[0]["metadata"]["namespace"] = "team-b"
    code, found = check(tmp_path, docs)
    assert code == 2
    assert codes(found) == {
        ("error", "manifest-namespace", "Job my-training", "metadata.namespace"),
        ("info", "manifest-renamed", "Job my-training", "metadata.namespace"),
    }


@pytest.mark.parametrize("name", ["experiment-7", "my-trainer"])
def test_a_job_name_without_the_job_name_is_an_error(tmp_path: Path, name: str) -> None:
    _, docs = rendered(tmp_path)
    of_kind(docs, "Job")[0]["metadata"]["name"] = name
    code, found = check(tmp_path, docs)
    assert code == 2
    assert codes(found) == {("error", "manifest-job-name", f"Job {name}", "metadata.name")}
    assert f"{name}-<index>" in found[0]["rule"] and "my-training-0" in found[0]["rule"]


def test_a_jobset_whose_pods_lose_the_job_name_is_an_error(tmp_path: Path) -> None:
    _, docs = rendered(tmp_path, starter_named("llm-workers-0"), "--jobset")
    prefix(docs, namespace=None)
    assert check(tmp_path, docs)[0] == 0  # exp1-llm-workers-0-<i> still holds llm-workers-0
    of_kind(docs, "JobSet")[0]["spec"]["replicatedJobs"][0]["name"] = "trainers"
    code, found = check(tmp_path, docs)
    assert code == 2
    errors = [f for f in found if f["severity"] == "error"]
    assert codes(errors) == {("error", "manifest-job-name", "JobSet exp1-llm", "metadata.name")}
    assert "exp1-llm-trainers-0-<index>" in errors[0]["rule"]


def test_the_renamed_services_ports_are_still_compared(tmp_path: Path) -> None:
    _, docs = rendered(tmp_path)
    prefix(docs)
    of_kind(docs, "Service")[0]["spec"]["ports"][0]["port"] = 29999
    code, found = check(tmp_path, docs)
    assert code == 1
    assert ("warning", "manifest-mismatch", "Service exp1-my-training", "spec.ports[0].port") in codes(found)


def test_the_control_pod_must_share_the_training_pods_subdomain(tmp_path: Path) -> None:
    _, docs = rendered(tmp_path, with_control_store(STARTER))
    prefix(docs)
    assert check(tmp_path, docs)[0] == 0
    [control] = [d for d in of_kind(docs, "Job") if d["metadata"]["name"].endswith("-control")]
    control["spec"]["template"]["spec"]["subdomain"] = "my-training"  # left behind by a rename
    code, found = check(tmp_path, docs)
    assert code == 2
    errors = [f for f in found if f["severity"] == "error"]
    assert codes(errors) == {
        ("error", "manifest-subdomain", "Job exp1-my-training-control", "spec.template.spec.subdomain")
    }
    assert "training pods' subdomain" in errors[0]["rule"]
    assert "my-training-control.<their subdomain>" in errors[0]["rule"]


def test_a_prefix_that_makes_a_hostname_too_long_is_an_error(tmp_path: Path) -> None:
    _, docs = rendered(tmp_path)  # 2 pods: my-training-0, my-training-1
    prefix(docs, "p" * 49 + "-")  # p...p-my-training-1: 63 characters, the most allowed
    assert check(tmp_path, docs)[0] == 0
    prefix(docs, "x", namespace=None)  # one more: 64
    code, found = check(tmp_path, docs)
    assert code == 2
    [error] = [f for f in found if f["severity"] == "error"]
    assert (error["code"], error["key"]) == ("manifest-job-name", "metadata.name")
    assert "longer than 63 characters" in error["rule"]

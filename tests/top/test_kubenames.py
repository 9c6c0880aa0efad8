"""Kubernetes naming in one module: the DNS-label rules at their limits, the names of a job's pods,
and that the manifests and the launcher take them from it."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

import nvtrain
from nvtrain import kubenames
from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.kubenames import (
    PodNames,
    check_dns_label,
    check_dns_subdomain,
    check_qualified_name,
    control_name,
    headless_service,
    is_dns_1035_label,
    is_dns_label,
    is_dns_subdomain,
    pod_name,
    store_name,
)

SRC = Path(nvtrain.__file__).resolve().parent


def policy(**rendezvous: object) -> Policy:
    return Policy.model_validate({"job": {"name": "llm-train", "script": "t.py"}, "rendezvous": rendezvous})


@pytest.mark.parametrize(
    ("text", "label", "label_1035"),
    [
        ("a", True, True),
        ("llm-train-0", True, True),
        ("0llm", True, False),  # a digit first: a pod hostname, not a Service name
        ("a" * 63, True, True),
        ("a" * 64, False, False),
        ("Llm", False, False),
        ("-llm", False, False),
        ("llm-", False, False),
        ("llm.train", False, False),
        ("llm\n", False, False),  # fullmatch: a trailing newline is not let through
        ("", False, False),
    ],
)
def test_dns_labels_at_their_limits(text: str, label: bool, label_1035: bool) -> None:
    assert is_dns_label(text) is label
    assert is_dns_1035_label(text) is label_1035


def test_dns_subdomains_are_labels_joined_by_dots_up_to_253_characters() -> None:
    longest = ".".join(["a" * 63] * 3 + ["a" * 61])
    assert len(longest) == 253 and is_dns_subdomain(longest)
    assert not is_dns_subdomain(longest + "a")
    assert is_dns_subdomain("team.example.com")
    assert not is_dns_subdomain("team..example")
    assert not is_dns_subdomain("Team")


def test_checks_name_the_flag_the_value_and_the_fix() -> None:
    with pytest.raises(UsageError, match=r"--priority-class 'Bad_Name' is not a PriorityClass name") as found:
        check_dns_subdomain("--priority-class", "Bad_Name", "PriorityClass")
    assert "lowercase letters" in found.value.fix
    with pytest.raises(UsageError, match=r"--init-container name 'a\.b' is not a container name"):
        check_dns_label("--init-container name", "a.b", "container")
    with pytest.raises(UsageError, match=r"--label key 'example\.com/' is not valid"):
        check_qualified_name("--label", "example.com/")
    check_dns_subdomain("--priority-class", "high.example", "PriorityClass")
    check_dns_label("--init-container name", "stage-data", "container")
    check_qualified_name("--label", "example.com/team")
    with pytest.raises(UsageError):
        check_qualified_name("--label", f"{'a' * 254}/team")  # the prefix is a DNS subdomain


def test_pod_names_of_a_policy() -> None:
    names = PodNames.of(policy(service="svc-a", namespace="research", cluster_domain="k8s.example"))
    assert names == PodNames("llm-train", "svc-a.research.svc.k8s.example", "llm-train-control")
    assert names.pod(3) == "llm-train-3.svc-a.research.svc.k8s.example"
    assert names.control() == "llm-train-control.svc-a.research.svc.k8s.example"


def test_the_store_is_pod_0_or_the_control_pod() -> None:
    assert store_name(policy()) == pod_name(policy(), 0) == "llm-train-0.llm-train.default.svc.cluster.local"
    control = policy(store="control", nodes=2)
    assert (
        store_name(control)
        == control_name(control)
        == "llm-train-control.llm-train.default.svc.cluster.local"
    )
    renamed = PodNames("exp1-llm-train", "exp1.ml.svc.cluster.local", "llm-train-control")
    assert store_name(policy(), renamed) == "exp1-llm-train-0.exp1.ml.svc.cluster.local"


def test_headless_service_of_a_pod_dns_name() -> None:
    assert headless_service(pod_name(policy(namespace="ml"), 1)) == ("llm-train", "ml")
    assert headless_service("node0.example.com") is None
    assert headless_service("10.0.0.1") is None


def test_the_manifests_give_the_pods_the_names_the_launcher_dials() -> None:
    """The control pod's hostname, subdomain and namespace in the rendered Job make the name that
    the training pods dial: both come from this module."""
    from nvtrain.kube.manifest import render
    from nvtrain.kube.objects import control_job_name

    text = '[job]\nname = "llm-train"\nscript = "train.py"\n\n[rendezvous]\nnodes = 2\nstore = "control"\n'
    p = Policy.model_validate(tomllib.loads(text))
    [control] = [o for o in render(p, text) if o["metadata"]["name"] == control_job_name(p)]
    pod = control["spec"]["template"]["spec"]
    dialled = f"{pod['hostname']}.{pod['subdomain']}.{control['metadata']['namespace']}.svc.cluster.local"
    assert dialled == control_name(p) == store_name(p)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_naming_sits_below_the_launcher_and_the_kube_package() -> None:
    """kubenames imports nothing of nvtrain but errors (so config can use it too); the kube
    package never imports the launcher; the launcher's names are kubenames' own."""
    own = {m for m in _imports(SRC / "kubenames.py") if m.startswith("nvtrain")}
    assert own == {"nvtrain.errors"}
    upward = {
        (path.name, m)
        for path in (SRC / "kube").rglob("*.py")
        for m in _imports(path)
        if m.startswith("nvtrain.launcher")
    }
    assert upward == set()
    from nvtrain.launcher import dns

    assert (dns.PodNames, dns.store_name, dns.CONTROL_SUFFIX) == (
        kubenames.PodNames,
        kubenames.store_name,
        kubenames.CONTROL_SUFFIX,
    )

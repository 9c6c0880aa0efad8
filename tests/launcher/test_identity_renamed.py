"""Peers found after a rename: the pods take pod 0's name from their own hostname and DNS name.

Kustomize's ``namePrefix`` renames the Job (so the pods' hostnames, ``<job>-<index>``) and, with
the nameReference configuration of docs/kubernetes.md, the Service and the pods' ``subdomain``;
``namespace`` moves them all. The kubelet then writes the pod's own DNS name into ``/etc/hosts``.
Each test builds that environment (hostname, variables, a hosts file as the kubelet writes it) and
checks the names ``identify`` and the plans derive from it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nvtrain.config.schema import Policy
from nvtrain.launcher.control import build_control_plan
from nvtrain.launcher.dns import DnsTimeout, PodNames, pod_name
from nvtrain.launcher.identity import identify, pod_names
from nvtrain.launcher.plan import build_plan
from nvtrain.nvrx import NvrxVersion

RUN = {"NVTRAIN_RUN_ID": "job-uid-1234"}
V070 = NvrxVersion(0, 7, 0)


def policy(nodes: int = 4, name: str = "llm-train", store: str = "pod0") -> Policy:
    return Policy.model_validate(
        {"job": {"name": name, "script": "train.py"}, "rendezvous": {"nodes": nodes, "store": store}}
    )


def kubelet_hosts(tmp_path: Path, hostname: str, domain: str | None, ip: str = "10.4.0.7") -> Path:
    """The hosts file the kubelet writes into a pod (with ``subdomain``: the pod's full name)."""
    lines = [
        "# Kubernetes-managed hosts file.",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "fe00::0\tip6-localnet",
    ]
    lines.append(f"{ip}\t{hostname}.{domain}\t{hostname}" if domain else f"{ip}\t{hostname}")
    path = tmp_path / "hosts"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def plan_endpoint(p: Policy, env: dict[str, str], hostname: str, hosts: Path | None) -> tuple[str, str]:
    identity = identify(p, env, hostname=hostname, hosts_file=hosts)
    plan = build_plan(
        p, identity, V070, python="python", policy_path="/etc/nvtrain/policy.toml", events_path="e.jsonl"
    )
    assert identity.address is not None
    return plan.endpoint, identity.address


def test_a_prefixed_job_in_another_namespace_dials_its_own_pod_0(tmp_path: Path) -> None:
    hosts = kubelet_hosts(tmp_path, "exp1-llm-train-2", "exp1-llm-train.team-a.svc.cluster.local")
    env = {**RUN, "JOB_COMPLETION_INDEX": "2"}
    endpoint, address = plan_endpoint(policy(), env, "exp1-llm-train-2", hosts)
    assert endpoint == "exp1-llm-train-0.exp1-llm-train.team-a.svc.cluster.local:29500"
    assert address == "exp1-llm-train-2.exp1-llm-train.team-a.svc.cluster.local"  # no POD_IP


def test_the_unrenamed_job_keeps_the_policys_names(tmp_path: Path) -> None:
    hosts = kubelet_hosts(tmp_path, "llm-train-1", "llm-train.default.svc.cluster.local")
    endpoint, _ = plan_endpoint(policy(), {**RUN, "JOB_COMPLETION_INDEX": "1"}, "llm-train-1", hosts)
    assert endpoint == f"{pod_name(policy(), 0)}:29500"


@pytest.mark.parametrize(
    ("hostname", "base", "rank"),
    [
        ("llm-train-3", "llm-train", 3),
        ("exp1-llm-train-3", "exp1-llm-train", 3),
        ("llm-train-v2-3", "llm-train-v2", 3),
        ("llm-train-2-0", "llm-train-2", 0),  # nameSuffix "-2": the last number is the index
        ("a-llm-train-b-1", "a-llm-train-b", 1),
    ],
)
def test_the_hostname_gives_the_rank_and_the_base_name_with_a_prefix_or_suffix(
    tmp_path: Path, hostname: str, base: str, rank: int
) -> None:
    hosts = kubelet_hosts(tmp_path, hostname, f"{base}.ml.svc.cluster.local")
    found = identify(policy(), dict(RUN), hostname=hostname, hosts_file=hosts)
    assert found.node_rank == rank
    assert found.names == PodNames(
        base=base, domain=f"{base}.ml.svc.cluster.local", control_host="llm-train-control"
    )


def test_the_domain_comes_from_a_full_hostname_without_reading_the_hosts_file() -> None:
    found = identify(
        policy(), dict(RUN), hostname="exp1-llm-train-1.exp1-llm-train.ml.svc.c.example", hosts_file=None
    )
    assert found.names is not None
    assert found.names.pod(0) == "exp1-llm-train-0.exp1-llm-train.ml.svc.c.example"


def test_without_a_subdomain_the_domain_stays_the_policys(tmp_path: Path) -> None:
    # A pod without `subdomain` has only its short hostname in /etc/hosts.
    hosts = kubelet_hosts(tmp_path, "exp1-llm-train-1", None)
    found = identify(
        policy(), {**RUN, "JOB_COMPLETION_INDEX": "1"}, hostname="exp1-llm-train-1", hosts_file=hosts
    )
    assert found.names is not None
    assert found.names.pod(0) == "exp1-llm-train-0.llm-train.default.svc.cluster.local"


@pytest.mark.parametrize(
    "line",
    [
        "10.0.0.1\texp1-llm-train-1.example.com\texp1-llm-train-1",  # not <sub>.<ns>.svc.<domain>
        "10.0.0.1\texp1-llm-train-1.a.b.notsvc.cluster.local",
        "10.0.0.1\texp1-llm-train-10.x.ml.svc.cluster.local",  # another host's name
        "# 10.0.0.1\texp1-llm-train-1.x.ml.svc.cluster.local",  # a comment
    ],
)
def test_only_the_kubelets_line_for_this_host_counts(tmp_path: Path, line: str) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{line}\n", encoding="utf-8")
    names = pod_names(policy(), {}, hostname="exp1-llm-train-1", hosts_file=hosts)
    assert names.domain == "llm-train.default.svc.cluster.local"


def test_an_unreadable_hosts_file_falls_back_to_the_policy(tmp_path: Path) -> None:
    names = pod_names(policy(), {}, hostname="exp1-llm-train-1", hosts_file=tmp_path / "missing")
    assert names == PodNames("exp1-llm-train", "llm-train.default.svc.cluster.local", "llm-train-control")


def test_a_hostname_without_the_job_name_is_not_the_jobs(tmp_path: Path) -> None:
    # NVTRAIN_NODE_RANK on a machine whose name says nothing about the job: the policy's names,
    # even where that machine's hosts file has a full name of the kubelet's shape.
    hosts = kubelet_hosts(tmp_path, "laptop-1", "laptop.ml.svc.cluster.local")
    found = identify(policy(), {**RUN, "NVTRAIN_NODE_RANK": "1"}, hostname="laptop-1", hosts_file=hosts)
    assert found.names == PodNames.of(policy())


def test_a_hostname_index_that_is_not_the_rank_is_not_this_pods_name(tmp_path: Path) -> None:
    # JOB_COMPLETION_INDEX=1 but the hostname ends in 3: the hostname is not the Indexed Job's.
    hosts = kubelet_hosts(tmp_path, "exp1-llm-train-3", "exp1-llm-train.ml.svc.cluster.local")
    env = {**RUN, "JOB_COMPLETION_INDEX": "1"}
    found = identify(policy(), env, hostname="exp1-llm-train-3", hosts_file=hosts)
    assert found.names == PodNames.of(policy())


def test_the_control_store_is_dialled_under_the_pods_own_domain(tmp_path: Path) -> None:
    p = policy(store="control")
    hosts = kubelet_hosts(tmp_path, "exp1-llm-train-1", "exp1-llm-train.team-a.svc.cluster.local")
    endpoint, _ = plan_endpoint(p, {**RUN, "JOB_COMPLETION_INDEX": "1"}, "exp1-llm-train-1", hosts)
    # The manifest sets the control pod's hostname literally, so a rename leaves it as it is.
    assert endpoint == "llm-train-control.exp1-llm-train.team-a.svc.cluster.local:29500"


def test_the_control_pod_waits_for_its_own_renamed_name(tmp_path: Path) -> None:
    p = policy(store="control")
    hosts = kubelet_hosts(tmp_path, "llm-train-control", "exp1-llm-train.team-a.svc.cluster.local")
    names = pod_names(p, {}, hostname="llm-train-control", hosts_file=hosts)
    plan = build_control_plan(p, V070, python="python", names=names)
    assert plan.wait_for == "llm-train-control.exp1-llm-train.team-a.svc.cluster.local"
    assert plan.endpoint == f"{plan.wait_for}:29500"
    assert (
        build_control_plan(p, V070, python="python").wait_for
        == "llm-train-control.llm-train.default.svc.cluster.local"
    )


def test_a_one_node_job_needs_no_names(tmp_path: Path) -> None:
    hosts = kubelet_hosts(tmp_path, "exp1-llm-train-0", "exp1-llm-train.ml.svc.cluster.local")
    found = identify(policy(nodes=1), {}, hostname="exp1-llm-train-0", hosts_file=hosts)
    assert (found.standalone, found.names, found.address) == (True, None, None)


def test_the_dns_timeout_names_the_service_to_check_and_the_rename() -> None:
    text = str(
        DnsTimeout("exp1-llm-train-0.llm-train.team-a.svc.cluster.local", 300, "Name or service not known")
    )
    assert text.startswith("exp1-llm-train-0.llm-train.team-a.svc.cluster.local did not resolve within 300s")
    assert "no headless Service named 'llm-train' (the pods' subdomain) in namespace 'team-a'" in text
    assert "kubectl get service llm-train -n team-a" in text
    assert "Kustomize namePrefix or nameSuffix renames the Service but not the pods' `subdomain`" in text
    # A name of another shape still gets the advice, without a Service to name.
    short = str(DnsTimeout("store.local", 5, "timeout"))
    assert "named differently from the pods' subdomain" in short and "Kustomize" in short

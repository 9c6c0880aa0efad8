"""A pod of a TrainJob with any name finds its peers: ``nvtrain run --dry-run`` in the
environment that Kubernetes gives a pod of nvtrain's Trainer runtime.

The environment is built from the rendered runtime itself: its container's variables, each
``fieldRef`` read from the pod's labels and annotations as JobSet and the Job controller set
them (``jobset.sigs.k8s.io/jobset-name`` = the TrainJob's name, its UID, the completion index),
and each ``$(VAR)`` expanded as the kubelet does; the hostname ``<t>-node-0-<i>``. The TrainJob
is named as the Kubeflow SDK names it (12 random characters, ``test_trainer_sdk.py``), which do
not hold ``[job] name``: before ``NVTRAIN_TRAINJOB`` such a pod dialled the policy's
``llm-train-0`` (which does not exist: exit 3).
"""

from __future__ import annotations

import json
import os
import random
import re
import string
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from templates_helpers import MINIMAL, by_kind, policy_of

from nvtrain.kube.manifest import render
from nvtrain.kube.options import ManifestOptions
from nvtrain.launcher.identity import pod_names

POLICY = MINIMAL + 'nproc_per_node = 2\n[rendezvous]\nnodes = 3\nnamespace = "team-a"\n'
NVTRAIN = str(Path(sys.executable).with_name("nvtrain"))


def sdk_name() -> str:
    """A TrainJob name as ``kubeflow`` 0.5.0's ``train()`` makes one."""
    return random.choice(string.ascii_lowercase) + uuid.uuid4().hex[:11]


def runtime_container() -> dict[str, Any]:
    objects = render(policy_of(POLICY), POLICY, ManifestOptions(trainer_runtime="namespaced"))
    runtime = by_kind(objects, "TrainingRuntime")
    [job] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    [container] = job["template"]["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def kubelet_env(container: dict[str, Any], pod: dict[str, Any]) -> dict[str, str]:
    """The container's variables as the kubelet resolves them for ``pod`` (its ``metadata`` and
    ``status``): field references read, ``$(VAR)`` of an earlier variable expanded."""
    env: dict[str, str] = {}
    for entry in container["env"]:
        if "value" in entry:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), entry["value"])
        else:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            field = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            if field:
                value = pod["metadata"][field.group(1)][field.group(2)]
            else:
                assert path == "status.podIP", path
                value = pod["status"]["podIP"]
        env[entry["name"]] = value
    return env


def trainjob_pod(trainjob: str, index: int) -> dict[str, Any]:
    """What JobSet and the Job controller put on pod ``index`` of TrainJob ``trainjob``."""
    return {
        "metadata": {
            "name": f"{trainjob}-node-0-{index}-x7k2p",
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": trainjob,
                "jobset.sigs.k8s.io/jobset-uid": "5f0c8a7e-2b51-4c55-9d7e-0a1b2c3d4e5f",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
            },
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
        },
        "status": {"podIP": f"10.4.0.{index + 7}"},
    }


def dry_run(tmp_path: Path, env: dict[str, str], hostname: str, code: int = 0) -> dict[str, Any]:
    """The plan that ``nvtrain run --dry-run`` prints (with ``code`` not 0: its stderr)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY, encoding="utf-8")
    (tmp_path / "train.py").write_text("print('hello')\n", encoding="utf-8")
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "PYTHONPATH")}
    result = subprocess.run(
        [NVTRAIN, "run", "--dry-run", str(policy)],
        env={**base, **env, "HOSTNAME": hostname, "KUBERNETES_SERVICE_HOST": "10.96.0.1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == code, result.stdout + result.stderr
    if code:
        return {"stderr": result.stderr}
    first = result.stdout.index("{")
    plan, _ = json.JSONDecoder().raw_decode(result.stdout[first:])
    return plan  # type: ignore[no-any-return]


def test_a_pod_of_an_sdk_named_trainjob_dials_its_own_pod_0(tmp_path: Path) -> None:
    trainjob = sdk_name()
    env = kubelet_env(runtime_container(), trainjob_pod(trainjob, 2))
    plan = dry_run(tmp_path, env, f"{trainjob}-node-0-2")
    argv = plan["argv"]
    pod0 = f"{trainjob}-node-0-0.{trainjob}.team-a.svc.cluster.local"
    assert f"--rdzv-endpoint={pod0}:29500" in argv, argv
    assert "--nnodes=3:3" in argv and "--nproc-per-node=2" in argv, argv
    assert "--local-addr=10.4.0.9" in argv, argv  # POD_IP
    assert "--rdzv-id=5f0c8a7e-2b51-4c55-9d7e-0a1b2c3d4e5f" in argv, argv  # the JobSet's UID
    # The torchrun variables, as the upstream torch runtime sets them.
    pet = {k: v for k, v in env.items() if k.startswith("PET_")}
    assert pet == {
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": f"{trainjob}-node-0-0.{trainjob}",
        "PET_MASTER_PORT": "29500",
    }


def test_a_trainjob_name_that_is_no_dns_label_exits_2(tmp_path: Path) -> None:
    env = kubelet_env(runtime_container(), trainjob_pod("llm-train-exp1", 0))
    result = dry_run(tmp_path, {**env, "NVTRAIN_TRAINJOB": "LLM_exp1"}, "llm-train-exp1-node-0-0", code=2)
    assert "NVTRAIN_TRAINJOB='LLM_exp1' is not a TrainJob name" in result["stderr"], result
    assert "fix:" in result["stderr"] and "Traceback" not in result["stderr"], result


def test_the_pods_own_domain_wins_over_the_policys_namespace(tmp_path: Path) -> None:
    """A ClusterTrainingRuntime serves every namespace: the kubelet's line in /etc/hosts says
    which one this TrainJob runs in."""
    trainjob = sdk_name()
    host = f"{trainjob}-node-0-1"
    hosts = tmp_path / "hosts"
    hosts.write_text(f"10.4.0.8\t{host}.{trainjob}.team-b.svc.cluster.local\t{host}\n", encoding="utf-8")
    env = kubelet_env(runtime_container(), trainjob_pod(trainjob, 1))
    names = pod_names(policy_of(POLICY), env, hostname=host, rank=1, hosts_file=hosts)
    assert names.pod(0) == f"{trainjob}-node-0-0.{trainjob}.team-b.svc.cluster.local"
    assert names.pod(1) == f"{host}.{trainjob}.team-b.svc.cluster.local"

"""Every alert of ``nvtrain manifest --monitoring-rules`` in ``promtool test rules``: it fires in
its scenario for this job, and stays silent for jobs whose names hold this one's
(``llm-train-v2``, ``exp-llm-train``) in the same bad state; both on the rules as rendered
(namespace ``default``) and on the rules after ``kubectl kustomize`` with ``namespace: other``,
with the series in ``other``.

The rules are taken from the rendered PrometheusRule (less their annotations, which the
scenarios do not compare). Skipped without ``promtool`` unless ``NVTRAIN_PROMTOOL=require``
(CI), and the Kustomize half without ``kubectl`` unless ``NVTRAIN_KUBECTL=require``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from templates_helpers import MINIMAL
from typer.testing import CliRunner

from nvtrain.cli import app

PROMTOOL = shutil.which("promtool")
if PROMTOOL is None and os.environ.get("NVTRAIN_PROMTOOL", "").strip().lower() == "require":
    raise RuntimeError("NVTRAIN_PROMTOOL=require but promtool is not installed (apt-get install prometheus)")
KUBECTL = shutil.which("kubectl")
if KUBECTL is None and os.environ.get("NVTRAIN_KUBECTL", "").strip().lower() == "require":
    raise RuntimeError(
        "NVTRAIN_KUBECTL=require but kubectl is not installed (apt-get install kubernetes-client)"
    )
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")

runner = CliRunner()

JOB = "llm-train"
OTHERS = ("llm-train-v2", "exp-llm-train")
"""Jobs whose names hold ``JOB``: their series must never fire ``JOB``'s alerts."""
NODES = 4
TEXT = (
    MINIMAL
    + f"nproc_per_node = 8\n[rendezvous]\nnodes = {NODES}\n[checkpoint]\ninterval = 250\n"
    + "[metrics]\nenabled = true\n"
)

Series = list[dict[str, str]]

QUIET_AGAIN = {"NvtrainPodsReplacedFrequent": ["85m"]}
"""When an alert has stopped firing again, its bad state over, while its series remain."""


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    text = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{text}}}", "values": values}


def pod(job: str, index: int, end: str = "bcdfg") -> str:
    """A pod name of an Indexed Job: ``<job>-<index>-<5 random characters>``."""
    return f"{job}-{index}-{end}"


# Each scenario: the series of one job (name, namespace) in the bad state, when to look, and
# the labels the alert has besides severity and nvtrain_job.
def stalled(job: str, ns: str) -> Series:
    at = {"namespace": ns, "pod": pod(job, 0), "run_id": f"{job}-r"}
    return [
        series("nvtrain_last_step_timestamp_seconds", "0x40", **at),
        series("nvtrain_recovering", "0x40", **at),
    ]


def recovering(job: str, ns: str) -> Series:
    at = {"namespace": ns, "pod": pod(job, 0), "run_id": f"{job}-r"}
    return [series("nvtrain_recovering", "1x40", **at)]


def restarting(job: str, ns: str) -> Series:
    at = {"namespace": ns, "pod": pod(job, 0), "run_id": f"{job}-r"}
    return [series("nvtrain_restarts_total", "0+1x40", layer="in_process", cause="fault", **at)]


def stale_checkpoint(job: str, ns: str) -> Series:
    at = {"namespace": ns, "pod": pod(job, 0), "run_id": f"{job}-r"}
    return [series("nvtrain_checkpoint_age_steps", "1000x40", **at)]


def checkpoint_problems(job: str, ns: str) -> Series:
    at = {"namespace": ns, "pod": pod(job, 0), "run_id": f"{job}-r"}
    return [series("nvtrain_checkpoint_problems_total", "0+1x40", problem="save_failed", **at)]


def exited(job: str, ns: str) -> Series:
    at = {"namespace": ns, "pod": pod(job, 0), "run_id": f"{job}-r"}
    return [series("nvtrain_exit_code", "_x5 1x35", **at)]


def pod_zero_gone(job: str, ns: str) -> Series:
    """Pod 0 runs 5 minutes and is evicted; its replacement stays Pending; the Job has pods."""
    return [
        series("kube_job_status_active", f"{NODES}x40", namespace=ns, job_name=job),
        series("kube_pod_status_phase", "1x5 _x35", namespace=ns, pod=pod(job, 0), phase="Running"),
        series("kube_pod_status_phase", "_x5 0x35", namespace=ns, pod=pod(job, 0, "hjklm"), phase="Running"),
        series("kube_pod_status_phase", "_x5 1x35", namespace=ns, pod=pod(job, 0, "hjklm"), phase="Pending"),
        # Pod 1 runs all along: a running pod of another index is not pod 0.
        series("kube_pod_status_phase", "1x40", namespace=ns, pod=pod(job, 1), phase="Running"),
    ]


def replaced(job: str, ns: str) -> Series:
    """NODES pods; pod 1 fails 3 minutes after it starts and is replaced, every 4 minutes: its
    6th pod starts at 20 min and runs. The failed pods stay in the API (Failed) to the end."""
    at = {"namespace": ns, "phase": "Failed"}
    found = [series("kube_pod_created", "0x100", namespace=ns, pod=pod(job, i)) for i in range(NODES)]
    found += [series("kube_pod_status_phase", "0x100", pod=pod(job, i), **at) for i in (0, 2, 3)]
    for n, end in enumerate(("bcdfg", "hjklm", "npqrs", "tvwxz", "bbbbb", "ccccc")):
        start = 4 * n  # minutes
        ran = "0x100" if n == 5 else f"0x2 1x{97 - start}"  # Failed after 3 minutes
        found.append(
            series(
                "kube_pod_created",
                f"_x{start} {60 * start}x{100 - start}",
                namespace=ns,
                pod=pod(job, 1, end),
            )
        )
        found.append(series("kube_pod_status_phase", f"_x{start} {ran}", pod=pod(job, 1, end), **at))
    return found


def failed(job: str, ns: str) -> Series:
    """Exit 1 until the backoff limit: the Job's Failed condition after 5 minutes."""
    return [
        series("kube_job_failed", "0x5 1x35", namespace=ns, job_name=job, condition="true"),
        series("kube_job_failed", "1x5 0x35", namespace=ns, job_name=job, condition="false"),
    ]


SCENARIOS: dict[str, tuple[Callable[[str, str], Series], str, str, dict[str, str]]] = {
    # alert: (the bad state, when it is too early, when it fires, its labels besides ours)
    "NvtrainStepStalled": (stalled, "10m", "25m", {"run_id": f"{JOB}-r"}),
    "NvtrainRecoveryTooLong": (recovering, "10m", "30m", {"run_id": f"{JOB}-r"}),
    "NvtrainRestartsFrequent": (restarting, "1m", "10m", {"run_id": f"{JOB}-r"}),
    "NvtrainCheckpointStale": (stale_checkpoint, "5m", "20m", {"run_id": f"{JOB}-r"}),
    "NvtrainCheckpointProblems": (
        checkpoint_problems,
        "0m",
        "10m",
        {"run_id": f"{JOB}-r", "problem": "save_failed"},
    ),
    "NvtrainRunFailed": (exited, "3m", "10m", {"run_id": f"{JOB}-r"}),
    "NvtrainPodZeroMissing": (pod_zero_gone, "12m", "30m", {"job_name": JOB}),
    # 4 pods failed by 15 min; the last failure, at 19 min, is more than an hour old at 80 min.
    "NvtrainPodsReplacedFrequent": (replaced, "10m", "18m", {"job_name": JOB}),
    "NvtrainJobFailed": (failed, "3m", "10m", {"job_name": JOB}),
}


def rendered(tmp_path: Path) -> Path:
    """``nvtrain manifest --monitoring-rules`` into ``tmp_path/base/job.yaml``."""
    base = tmp_path / "base"
    base.mkdir()
    policy = tmp_path / "policy.toml"
    policy.write_text(TEXT, encoding="utf-8")
    result = runner.invoke(app, ["manifest", str(policy), "--monitoring-rules", "-o", str(base / "job.yaml")])
    assert result.exit_code == 0, result.output
    return base / "job.yaml"


def kustomized(manifest: Path, namespace: str) -> Path:
    """``kubectl kustomize`` of ``manifest`` with ``namespace: <namespace>``."""
    (manifest.parent / "kustomization.yaml").write_text(
        f"resources:\n- {manifest.name}\nnamespace: {namespace}\n", encoding="utf-8"
    )
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(manifest.parent)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    out = manifest.parent.parent / "kustomized.yaml"
    out.write_text(done.stdout, encoding="utf-8")
    return out


def rules_file(manifest: Path, namespace: str) -> Path:
    """The PrometheusRule's spec of ``manifest`` (in ``namespace``) as a rules file, less the
    annotations."""
    [rule] = [
        d
        for d in yaml.safe_load_all(manifest.read_text(encoding="utf-8"))
        if d and d["kind"] == "PrometheusRule"
    ]
    assert rule["metadata"]["namespace"] == namespace
    groups = rule["spec"]["groups"]
    for group in groups:
        for r in group["rules"]:
            r.pop("annotations", None)
    assert {r["alert"] for g in groups for r in g["rules"]} == set(SCENARIOS)
    path = manifest.parent / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    return path


def promtool_test(rules: Path, namespace: str, alert: str) -> subprocess.CompletedProcess[str]:
    state, early, late, labels = SCENARIOS[alert]
    inputs = [s for job in (JOB, *OTHERS) for s in state(job, namespace)]
    severity = next(
        r["labels"]["severity"]
        for g in yaml.safe_load(rules.read_text(encoding="utf-8"))["groups"]
        for r in g["rules"]
        if r["alert"] == alert
    )
    want = {"severity": severity, "nvtrain_job": JOB, "namespace": namespace, **labels}
    test: dict[str, Any] = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "alert_rule_test": [
                    {"eval_time": early, "alertname": alert, "exp_alerts": []},
                    {"eval_time": late, "alertname": alert, "exp_alerts": [{"exp_labels": want}]},
                ]
                + [
                    {"eval_time": t, "alertname": alert, "exp_alerts": []} for t in QUIET_AGAIN.get(alert, [])
                ],
            }
        ],
    }
    path = rules.parent / f"test-{alert}.yaml"
    path.write_text(yaml.safe_dump(test), encoding="utf-8")
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("alert", sorted(SCENARIOS))
def test_each_alert_fires_for_this_job_only(tmp_path: Path, alert: str) -> None:
    rules = rules_file(rendered(tmp_path), "default")
    done = promtool_test(rules, "default", alert)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize("alert", sorted(SCENARIOS))
def test_each_alert_fires_after_a_kustomize_namespace(tmp_path: Path, alert: str) -> None:
    rules = rules_file(kustomized(rendered(tmp_path), "other"), "other")
    done = promtool_test(rules, "other", alert)
    assert done.returncode == 0, done.stdout + done.stderr

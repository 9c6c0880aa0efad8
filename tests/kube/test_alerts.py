"""``nvtrain manifest --monitoring-rules``: the Prometheus alerts and the Grafana dashboard.

Every PromQL expression reads only series that nvtrain serves (taken from ``live/figures.py``,
where the figures are made, not from a list kept here), with labels it serves. With Prometheus'
``promtool`` installed (Debian: ``apt-get install prometheus``) the rules and the dashboard's
expressions are parsed by it, and the stall alert is run on synthetic series (``promtool test
rules``); without it those tests are skipped, and with ``NVTRAIN_PROMTOOL=require`` (for CI) that
fails instead.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from templates_helpers import KUBERNETES_VERSIONS, MINIMAL, by_kind, load_all, object_errors, policy_of
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.kube import alerts
from nvtrain.kube.manifest import render
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.yaml_io import dump
from nvtrain.live.pod import POD_FAMILIES

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = shutil.which("promtool")
if PROMTOOL is None and os.environ.get("NVTRAIN_PROMTOOL", "").strip().lower() == "require":
    raise RuntimeError("NVTRAIN_PROMTOOL=require but promtool is not installed (apt-get install prometheus)")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")

runner = CliRunner()

STEP_AT = "nvtrain_last_step_timestamp_seconds"

TEXT = (
    MINIMAL
    + "nproc_per_node = 8\n[rendezvous]\nnodes = 4\n[checkpoint]\ninterval = 250\n[metrics]\nenabled = true\n"
)
OPTIONS = ManifestOptions(monitoring_rules=True)

TARGET_LABELS = {"namespace", "pod", "run_id", "le"}
"""Labels a series has besides its own: Kubernetes service discovery's, the run id, the bucket."""


def served() -> tuple[set[str], set[str]]:
    """(series names, label names) that ``nvtrain.live`` serves: each ``add(name, kind,
    ...)`` of ``figures`` with the suffixes its kind gets, the ``nvtrain_run`` info, and the
    pods' own figures."""
    tree = ast.parse((ROOT / "src" / "nvtrain" / "live" / "figures.py").read_text(encoding="utf-8"))
    names = {"nvtrain_run_info"}
    labels: set[str] = set()
    suffixes = {"gauge": [""], "counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "add":
            name, kind = (a.value for a in node.args[:2] if isinstance(a, ast.Constant))
            names |= {f"nvtrain_{name}{s}" for s in suffixes[str(kind)]}
        if isinstance(node, ast.Dict):  # the label sets: {"cause": cause}, {"layer": ..., "phase": ...}
            labels |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    assert len(names) > 20, names  # the parse found the figures
    for name, (kind, _) in POD_FAMILIES.items():  # every pod's own (nvtrain.live.pod)
        names |= {f"nvtrain_{name}{s}" for s in suffixes[kind]}
    return names, labels | {"node_rank"}


def rules() -> list[dict[str, Any]]:
    return alerts.alert_rules(policy_of(TEXT))


def expressions() -> list[str]:
    panels = alerts.dashboard(policy_of(TEXT))["panels"]
    return [r["expr"] for r in rules()] + [t["expr"] for p in panels for t in p["targets"]]


KUBE_STATE_METRICS = {
    "kube_job_status_active": {"namespace", "job_name"},
    "kube_job_failed": {"namespace", "job_name", "condition"},
    "kube_pod_status_phase": {"namespace", "pod", "uid", "phase"},
    "kube_pod_created": {"namespace", "pod", "uid"},
}
"""The kube-state-metrics series the rules read, with the labels it gives them by default (no
``--metric-labels-allowlist`` needed)."""


def grouped(expr: str) -> set[str]:
    return {g.strip() for by in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr) for g in by.split(",")}


def test_every_expression_reads_only_what_nvtrain_serves() -> None:
    names, labels = served()
    for expr in expressions():
        used = set(re.findall(r"\bnvtrain_[a-z_]+\b", expr))
        kube = set(re.findall(r"\bkube_[a-z_]+\b", expr))
        if kube:  # what the pods cannot tell: kube-state-metrics' series, by their own labels
            assert not used and kube <= set(KUBE_STATE_METRICS), (expr, kube - set(KUBE_STATE_METRICS))
            known = set().union(*(KUBE_STATE_METRICS[k] for k in kube)) | {"job_name"}  # label_replace
            assert grouped(expr) <= known, (expr, grouped(expr) - known)
            # This Job by its name, or its pods by theirs (pod 0's, or any index).
            picked = set(re.findall(r'\b(job_name|pod)=~"([^"]*)"', expr))
            ours = {("job_name", "llm-train"), ("pod", "llm-train-0-[a-z0-9]{5}")}
            assert picked and picked <= ours | {("pod", "llm-train-[0-9]+-[a-z0-9]{5}")}, expr
            assert "namespace=" not in expr, expr
            continue
        assert used and used <= names, (expr, used - names)
        assert grouped(expr) <= labels | TARGET_LABELS, (expr, grouped(expr) - labels - TARGET_LABELS)
        # This job's pods only, in whatever namespace Kustomize puts them: no namespace named.
        assert 'pod=~"llm-train-[0-9]+-[a-z0-9]{5}"' in expr and "namespace=" not in expr, expr


def test_the_pod_patterns_match_this_jobs_pods_only() -> None:
    """The pods of the Job (and of a JobSet: ``[job] name`` is ``<jobset>-<rjob>-0``), pod 0
    replaced; not the pods of jobs whose names hold this one's, nor the control pod."""
    [pattern] = set(re.findall(r'pod=~"([^"]*)"', expressions()[0]))
    assert pattern == alerts.series_selector(policy_of(TEXT)).split('"')[1]
    ours = ["llm-train-0-abcde", "llm-train-0-x7k2p", "llm-train-3-bcdfg", "llm-train-12-zzzzz"]
    others = [
        "llm-train-v2-0-abcde",
        "exp-llm-train-0-abcde",
        "llm-train-0-0-abcde",
        "llm-train-control-abcde",
    ]
    others += ["llm-train-0", "llm-train-0-abcdef", "xllm-train-0-abcde"]
    assert [p for p in ours + others if re.fullmatch(pattern, p)] == ours


def test_the_dashboard_is_unique_per_namespace_and_job() -> None:
    """Grafana keeps one dashboard per uid and per title in a folder, and its sidecar writes one
    file per ConfigMap key: the job of one name in two namespaces must differ in all three."""
    seen = set()
    for namespace in ("default", "team-a"):
        for name in ("llm-train", "llm-train-v2"):
            text = TEXT.replace('name = "llm-train"', f'name = "{name}"')
            text = text.replace("[rendezvous]\n", f'[rendezvous]\nnamespace = "{namespace}"\n')
            policy = policy_of(text)
            assert (policy.rendezvous.namespace, policy.job.name) == (namespace, name)
            board = alerts.dashboard(policy)
            [key] = alerts.dashboard_configmap(policy, {"name": "x"})["data"]
            assert len(board["uid"]) <= 40
            seen.add((board["uid"], board["title"], key))
    assert len({u for u, _, _ in seen}) == len({t for _, t, _ in seen}) == len({k for _, _, k in seen}) == 4


def test_thresholds_come_from_the_policy() -> None:
    by_name = {r["alert"]: r for r in rules()}
    assert by_name["NvtrainCheckpointStale"]["expr"].endswith("> 500")  # 2 × [checkpoint] interval
    policy = policy_of(TEXT)
    late = policy.rendezvous.dns_timeout + policy.rendezvous.join_timeout
    assert by_name["NvtrainRecoveryTooLong"]["for"] == f"{int(late)}s"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_objects_are_valid(version: str) -> None:
    """The PrometheusRule against the prometheus-operator v0.93.0 CRD, the dashboard's
    ConfigMap against Kubernetes' schema."""
    objects = load_all(dump(render(policy_of(TEXT), TEXT, OPTIONS)))
    errors = [e for o in objects for e in object_errors(o, version)]
    assert not errors, "\n".join(errors)
    rule = by_kind(objects, "PrometheusRule")
    assert rule["metadata"]["name"] == "llm-train-alerts"
    [dashboard] = [o for o in objects if o["metadata"]["name"] == "llm-train-dashboard"]
    assert dashboard["metadata"]["labels"][alerts.DASHBOARD_LABEL] == "1"
    [text] = dashboard["data"].values()
    assert len(json.loads(text)["panels"]) >= 8


def test_monitoring_rules_need_the_metrics(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(MINIMAL, encoding="utf-8")
    result = runner.invoke(app, ["manifest", str(policy), "--monitoring-rules"])
    assert result.exit_code == 2, result.output
    assert "--monitoring-rules needs the policy's metrics endpoint" in result.stderr
    assert "fix:" in result.stderr and result.stdout == ""


@needs_promtool
def test_promtool_parses_the_rules_and_the_dashboard(tmp_path: Path) -> None:
    objects = render(policy_of(TEXT), TEXT, OPTIONS)
    spec = by_kind(objects, "PrometheusRule")["spec"]
    panels = [
        {"record": f"nvtrain:panel_{i}", "expr": e} for i, e in enumerate(expressions()[len(rules()) :])
    ]
    spec = {"groups": [*spec["groups"], {"name": "dashboard", "rules": panels}]}
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules()) + len(panels)} rules found" in done.stdout


@needs_promtool
def test_the_stall_alert_fires_only_when_no_recovery_runs(tmp_path: Path) -> None:
    """``promtool test rules`` on synthetic series: a run whose last step grows old fires
    NvtrainStepStalled; one that is recovering meanwhile, and another job's pods, do not."""
    stalled = {"alert": "NvtrainStepStalled"}
    group = [dict(r, annotations={}) for r in rules() if r["alert"] == stalled["alert"]]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": group}]}), encoding="utf-8")

    def series(metric: str, pod: str, run: str, values: str) -> dict[str, str]:
        return {"series": f'{metric}{{namespace="default", pod="{pod}", run_id="{run}"}}', "values": values}

    test = {
        "rule_files": [str(path)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # r1: the last step was at time 0, no recovery: stalled after 15 min + 5 min.
                    # Pod 0 was replaced at 10 min: both pods' series are seen, counted once.
                    series(STEP_AT, "llm-train-0-abcde", "r1", "0x10 _x30"),
                    series("nvtrain_recovering", "llm-train-0-abcde", "r1", "0x10 _x30"),
                    series(STEP_AT, "llm-train-0-fghij", "r1", "_x10 0x30"),
                    series("nvtrain_recovering", "llm-train-0-fghij", "r1", "_x10 0x30"),
                    # r2: recovering all along.
                    series(STEP_AT, "llm-train-0-klmno", "r2", "0x40"),
                    series("nvtrain_recovering", "llm-train-0-klmno", "r2", "1x40"),
                    # r4: steps on (the newest step 60 s ago at every minute).
                    series(STEP_AT, "llm-train-0-stuvw", "r4", "0+60x40"),
                    series("nvtrain_recovering", "llm-train-0-stuvw", "r4", "0x40"),
                    # Another job in the namespace.
                    series(STEP_AT, "other-0-pqrst", "r3", "0x40"),
                    series("nvtrain_recovering", "other-0-pqrst", "r3", "0x40"),
                ],
                "alert_rule_test": [
                    {"eval_time": "18m", "alertname": "NvtrainStepStalled", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "NvtrainStepStalled",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "nvtrain_job": "llm-train",
                                    "namespace": "default",
                                    "run_id": "r1",
                                }
                            }
                        ],
                    },
                ],
            }
        ],
    }
    tests = tmp_path / "test.yaml"
    tests.write_text(yaml.safe_dump(test), encoding="utf-8")
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr

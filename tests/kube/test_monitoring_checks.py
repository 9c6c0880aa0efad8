"""``nvtrain validate --manifest`` on the alerts and the dashboard of ``--monitoring-rules`` after
an edit: a query that reads another namespace than the job's, a name matcher that no Job of the
file matches any more (a namePrefix), and a dashboard uid of another namespace are warnings
(``manifest-monitoring``); what ``nvtrain manifest`` renders is none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from templates_helpers import MINIMAL
from typer.testing import CliRunner

from nvtrain.cli import app

runner = CliRunner()
TEXT = MINIMAL + "[rendezvous]\nnodes = 2\n[metrics]\nenabled = true\n"
Docs = list[dict[str, Any]]


def rendered(tmp_path: Path) -> Docs:
    policy = tmp_path / "policy.toml"
    policy.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "job.yaml"
    result = runner.invoke(app, ["manifest", str(policy), "--monitoring-rules", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return [d for d in yaml.safe_load_all(out.read_text(encoding="utf-8")) if d]


def monitoring(tmp_path: Path, docs: Docs) -> list[tuple[str, str, str | None]]:
    """(severity, table, key) of the ``manifest-monitoring`` findings of ``docs`` (checked
    against the policy in their ConfigMap)."""
    out = tmp_path / "edited.yaml"
    out.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    result = runner.invoke(app, ["validate", "--manifest", str(out), "--json"])
    assert "Traceback" not in result.output
    found = json.loads(result.stdout)["findings"]
    return sorted((f["severity"], f["table"], f["key"]) for f in found if f["code"] == "manifest-monitoring")


def moved(docs: Docs, namespace: str = "other") -> Docs:
    for doc in docs:
        doc["metadata"]["namespace"] = namespace  # what Kustomize's namespace: does
    return docs


def of_kind(docs: Docs, kind: str) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind]
    return found


MONITORING = ("PrometheusRule", "ConfigMap llm-train-dashboard")


def test_the_rules_may_live_in_a_monitoring_namespace(tmp_path: Path) -> None:
    """Where Prometheus and Grafana read them: the queries are compared with the Job's namespace
    and name, not the rule's, both when they still match and when they no longer do."""
    docs = rendered(tmp_path)
    assert monitoring(tmp_path, docs) == []  # what nvtrain renders
    for doc in docs:
        if f"{doc['kind']} {doc['metadata']['name']}".startswith(MONITORING):
            doc["metadata"]["namespace"] = "monitoring"
    rule = of_kind(docs, "PrometheusRule")
    expr = rule["spec"]["groups"][0]["rules"][0]["expr"]
    rule["spec"]["groups"][0]["rules"][0]["expr"] = expr.replace('pod=~"', 'namespace="default", pod=~"', 1)
    assert monitoring(tmp_path, docs) == []  # it reads the Job's namespace, default
    for doc in docs:
        if doc["kind"] in ("Job", "JobSet"):
            doc["metadata"]["name"] = "exp1-" + doc["metadata"]["name"]
    found = monitoring(tmp_path, docs)
    rules = [k for s, t, k in found if t == "PrometheusRule llm-train-alerts" and s == "warning"]
    assert len(rules) == len(rule["spec"]["groups"][0]["rules"]), found
    assert ("warning", "ConfigMap llm-train-dashboard", 'data["nvtrain-default-llm-train.json"]') in found


def test_a_query_of_the_old_namespace_is_a_warning(tmp_path: Path) -> None:
    """A rule as an older nvtrain rendered it (``namespace="default"``), then moved to ``other``."""
    docs = rendered(tmp_path)
    rule = of_kind(docs, "PrometheusRule")
    expr = rule["spec"]["groups"][0]["rules"][0]["expr"]
    rule["spec"]["groups"][0]["rules"][0]["expr"] = expr.replace('pod=~"', 'namespace="default", pod=~"', 1)
    assert monitoring(tmp_path, docs) == []  # still in default: it reads the job's namespace
    found = monitoring(tmp_path, moved(docs))
    assert ("warning", "PrometheusRule llm-train-alerts", "spec.groups[0].rules[0].expr") in found
    # The dashboard keeps the uid of default: two copies in two namespaces would collide.
    dashboard = [f for f in found if f[1] == "ConfigMap llm-train-dashboard"]
    assert [s for s, _, _ in dashboard] == ["warning"], found
    assert {s for s, _, _ in found} == {"warning"}


def test_a_name_prefix_leaves_the_queries_on_the_old_name(tmp_path: Path) -> None:
    docs = rendered(tmp_path)
    for doc in docs:
        doc["metadata"]["name"] = "exp1-" + doc["metadata"]["name"]
    found = monitoring(tmp_path, docs)
    rules = [k for s, t, k in found if t == "PrometheusRule exp1-llm-train-alerts" and s == "warning"]
    assert len(rules) == len(of_kind(docs, "PrometheusRule")["spec"]["groups"][0]["rules"]), found

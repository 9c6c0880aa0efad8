"""``--metrics-from NAMESPACE``: the NetworkPolicy admits the metrics port only from the namespace
of the Prometheus that scrapes it; without it, from every source (nvtrain cannot know where
Prometheus runs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from templates_helpers import KUBERNETES_VERSIONS, MINIMAL, by_kind, load_all, object_errors, policy_of
from typer.testing import CliRunner

from nvtrain.cli import app
from nvtrain.errors import UsageError
from nvtrain.kube.manifest import render
from nvtrain.kube.manifest_checks import check_manifest
from nvtrain.kube.monitoring import NAMESPACE_LABEL
from nvtrain.kube.options import ManifestOptions
from nvtrain.kube.yaml_io import dump

METRICS = MINIMAL + "nproc_per_node = 8\n[rendezvous]\nnodes = 2\n[metrics]\nenabled = true\nport = 9464\n"
runner = CliRunner()


def ingress(options: ManifestOptions, text: str = METRICS) -> list[dict[str, object]]:
    policy = by_kind(render(policy_of(text), text, options), "NetworkPolicy")
    return policy["spec"]["ingress"]  # type: ignore[no-any-return]


def test_the_metrics_port_is_admitted_only_from_the_named_namespace() -> None:
    peers, metrics = ingress(ManifestOptions(metrics_from="monitoring", pod_monitor=True))
    assert metrics == {
        "from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: "monitoring"}}}],
        "ports": [{"protocol": "TCP", "port": 9464}],
    }
    assert peers == {
        "from": [
            {
                "podSelector": {
                    "matchLabels": by_kind(render(policy_of(METRICS), METRICS, ManifestOptions()), "Service")[
                        "spec"
                    ]["selector"]
                }
            }
        ]
    }
    # Without it: the port alone, from every source.
    assert ingress(ManifestOptions())[1] == {"ports": [{"protocol": "TCP", "port": 9464}]}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_network_policy_is_valid(version: str) -> None:
    objects = load_all(dump(render(policy_of(METRICS), METRICS, ManifestOptions(metrics_from="monitoring"))))
    assert not [e for o in objects for e in object_errors(o, version)]


def test_validate_accepts_it(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump_all(
            render(policy_of(METRICS), METRICS, ManifestOptions(metrics_from="monitoring")), sort_keys=False
        ),
        encoding="utf-8",
    )
    assert check_manifest(path, policy_of(METRICS), policy_text=METRICS) == []


@pytest.mark.parametrize(
    ("text", "namespace", "message"),
    [
        (MINIMAL, "monitoring", "--metrics-from monitoring with [metrics] enabled = false"),
        (METRICS, "Monitoring", "--metrics-from 'Monitoring' is not a namespace name"),
        (METRICS, "a" * 64, "is not a namespace name"),
    ],
)
def test_a_bad_namespace_is_refused(text: str, namespace: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        render(policy_of(text), text, ManifestOptions(metrics_from=namespace))
    assert message in caught.value.message and caught.value.fix


def test_the_cli_option(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(METRICS, encoding="utf-8")
    result = runner.invoke(app, ["manifest", str(policy), "--metrics-from", "monitoring"])
    assert result.exit_code == 0, result.output
    rule = by_kind(load_all(result.stdout), "NetworkPolicy")["spec"]["ingress"][1]
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {NAMESPACE_LABEL: "monitoring"}
    result = runner.invoke(app, ["manifest", str(policy), "--metrics-from", "-x-"])
    assert result.exit_code == 2 and "is not a namespace name" in result.stderr and "fix:" in result.stderr

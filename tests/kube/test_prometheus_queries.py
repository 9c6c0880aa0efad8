"""The dashboard and the alert rules of ``nvtrain manifest --monitoring-rules`` against a real
Prometheus that scrapes a real ``nvtrain run``.

The CPU demo (2 ranks, gloo) under the real ft_launcher with a SIGKILL at step 25 serves its
metrics; a Prometheus server (Debian's ``prometheus``) scrapes it every second, with the target
labels that Kubernetes service discovery would add (``namespace``, ``pod``), and evaluates the
job's alert rules every second. Once the run's exit code is in Prometheus, every dashboard
query and every alert expression goes through Prometheus' HTTP API (``/api/v1/query``): each
must evaluate without error, the key ones must return data, and every rule's own evaluation
must be healthy (``/api/v1/rules``). Synchronised by polling the APIs against deadlines.

Skipped without ``prometheus`` unless ``NVTRAIN_PROMTOOL=require`` (CI), where it fails.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from nvtrain.config.validation import validate_file
from nvtrain.kube import alerts
from support.ports import free_port
from support.proc_helpers import NvtrainRunner, make_policy, write_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None and os.environ.get("NVTRAIN_PROMTOOL", "").strip().lower() == "require":
    raise RuntimeError(
        "NVTRAIN_PROMTOOL=require but prometheus is not installed (apt-get install prometheus)"
    )
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed")

T = TypeVar("T")

KEY_PANELS = (
    "Step",
    "Training goodput",
    "Infrastructure goodput",
    "Seconds since the last step",
    "Recovering",
    "Restarts per hour, by layer",
    "Steps since the newest checkpoint",
    "Steps lost to rollbacks",
    "Step of each pod",
    "Pod replacements, by node",
)
"""Dashboard panels that must show data once the run has ended (the percentiles may be NaN:
one recovery, and its bucket counts did not change between two scrapes)."""


def until(condition: Callable[[], T | None], what: str, seconds: float = 60.0) -> T:
    """Poll ``condition`` until it returns something, or fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        got = condition()
        if got is not None:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {seconds:.0f} s"
        time.sleep(0.1)


class Prometheus:
    """A Prometheus server on a free local port, with its own storage under ``directory``."""

    def __init__(self, directory: Path, config: dict[str, Any]) -> None:
        assert PROMETHEUS is not None
        self.port = free_port()
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        self.log = (directory / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.log_path = directory / "prometheus.log"

    def get(self, path: str, **params: str) -> dict[str, Any] | None:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                return json.loads(reply.read().decode())  # type: ignore[no-any-return]
        except urllib.error.HTTPError as exc:  # a bad query: the API says why, as JSON
            return json.loads(exc.read().decode())  # type: ignore[no-any-return]
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

    def ready(self) -> bool | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as reply:
                return True if reply.status == 200 else None
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            assert self.proc.poll() is None, f"prometheus exited:\n{self.describe()}"
            return None

    def query(self, expr: str) -> dict[str, Any]:
        reply = self.get("/api/v1/query", query=expr)
        assert reply is not None, f"no answer to {expr}"
        return reply

    def describe(self) -> str:
        self.log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def values(reply: dict[str, Any]) -> list[float]:
    """The sample values of an instant query's answer."""
    data = reply["data"]
    if data["resultType"] == "scalar":
        return [float(data["result"][1])]
    return [float(r["value"][1]) for r in data["result"]]


@needs_prometheus
def test_every_dashboard_query_and_alert_evaluates_on_real_series(
    nvtrain: NvtrainRunner, tmp_path: Path
) -> None:
    port = free_port()
    _, tables = make_policy(
        tmp_path,
        module="nvtrain.demo",
        args=["--steps", "60", "--step-time", "0.05"],
        heartbeat={"timeout": "15s"},
        warm_start=True,
    )
    tables["checkpoint"].update({"interval": 10, "keep": 2})
    tables["metrics"] = {"enabled": True, "port": port, "refresh": "0.2s", "linger": "5m"}
    path = write_policy(tmp_path, tables)
    with path.open("a", encoding="utf-8") as f:
        f.write('[[faults]]\nstep = 25\nrank = 1\nkind = "sigkill"\n')
    policy = validate_file(path, nvrx=None).policy
    assert policy is not None
    rules = alerts.alert_rules(policy)
    (tmp_path / "rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "nvtrain", "interval": "1s", "rules": rules}]}), encoding="utf-8"
    )
    # The labels that Kubernetes service discovery gives the pod of node 0 of this job.
    target = {"namespace": policy.rendezvous.namespace, "pod": f"{policy.job.name}-0-abcde"}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [
            {"job_name": "nvtrain", "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": target}]}
        ],
    }
    prometheus = Prometheus(tmp_path, config)
    try:
        until(prometheus.ready, "prometheus ready")
        run = nvtrain.start("--run-id", "prom-1", str(path))

        def exit_code_stored() -> float | None:
            assert run.proc.poll() is None, (
                f"nvtrain exited before its exit code was scraped\n{run.describe()}"
            )
            found = values(
                prometheus.query(f'nvtrain_exit_code{{run_id="prom-1", {alerts.series_selector(policy)}}}')
            )
            return found[0] if found else None

        assert until(exit_code_stored, "the exit code in Prometheus", 90) == 0.0

        def evaluations() -> dict[str, tuple[str, str]]:
            """Each rule's (last evaluation time, health)."""
            reply = prometheus.get("/api/v1/rules")
            assert reply is not None and reply.get("status") == "success", reply
            found = [r for g in reply["data"]["groups"] for r in g["rules"]]
            return {r["name"]: (r.get("lastEvaluation", ""), r["health"]) for r in found}

        before = evaluations()

        def evaluated_since() -> dict[str, tuple[str, str]] | None:
            """Every rule, once each was evaluated again after the exit code was stored."""
            now = evaluations()
            fresh = [
                n
                for n, (at, health) in now.items()
                if at != before.get(n, ("", ""))[0] and health != "unknown"
            ]
            return now if len(fresh) == len(rules) else None

        checked = until(evaluated_since, "an evaluation of every rule after the run ended", 30)
        unhealthy = {name for name, (_, health) in checked.items() if health != "ok"}
        assert not unhealthy, (unhealthy, prometheus.get("/api/v1/rules"))
        assert set(checked) == {r["alert"] for r in rules}

        # Every alert expression and every dashboard query, through the query API.
        failed: dict[str, Any] = {}
        for rule in rules:
            reply = prometheus.query(rule["expr"])
            if reply.get("status") != "success":
                failed[rule["alert"]] = reply.get("error")
        panels = {p["title"]: p["targets"][0]["expr"] for p in alerts.dashboard(policy)["panels"]}
        answers: dict[str, list[float]] = {}
        for title, expr in panels.items():
            reply = prometheus.query(expr)
            if reply.get("status") != "success":
                failed[title] = reply.get("error")
            else:
                answers[title] = values(reply)
        assert not failed, failed
        empty = [t for t in KEY_PANELS if not answers.get(t) or all(math.isnan(v) for v in answers[t])]
        assert not empty, {t: panels[t] for t in empty}
        assert max(answers["Step"]) == 60.0
        # The SIGKILL's restart, counted once. (Its increase() in the panel may be 0 when the
        # first scrape came after the recovery: a counter first seen at 1 has not increased.)
        restarts = values(
            prometheus.query(f"sum(nvtrain_restarts_total{{{alerts.series_selector(policy)}}})")
        )
        assert restarts == [1.0], restarts
        assert max(answers["Step of each pod"]) == 60.0
        assert answers["Pod replacements, by node"] == [0.0]
        assert 0 < max(answers["Training goodput"]) < 1
        assert 0 <= max(answers["Seconds since the last step"]) < 90
        # The stall alert's age part has data (the threshold part filters it out).
        stall = rules[0]["expr"].split(" > ")[0]
        assert values(prometheus.query(stall)), stall
    finally:
        prometheus.close()
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 0, run.describe()

"""``[metrics]``: `nvtrain run` serves the run's live figures for Prometheus over real HTTP.

The demo job (2 ranks, gloo) under the real ft_launcher, with a SIGKILL injected at step 25; the
test scrapes the endpoint while the job runs and parses what it got with Prometheus' own parser.
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from proc_helpers import NvtrainRunner, free_port, make_policy, read_events, write_policy
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples | None:
    """Every sample of one scrape, keyed by (name, sorted labels); None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted({"run_id": "metrics-1", **labels}.items()))))


def test_live_figures_follow_the_run(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    port = free_port()
    _, tables = make_policy(
        tmp_path,
        module="nvtrain.demo",
        args=["--steps", "60", "--step-time", "0.05"],
        heartbeat={"timeout": "15s"},
    )
    tables["checkpoint"].update({"interval": 10, "keep": 2})
    tables["metrics"] = {"enabled": True, "port": port, "refresh": "0.2s"}
    policy = write_policy(tmp_path, tables)
    with policy.open("a", encoding="utf-8") as f:
        f.write('[[faults]]\nstep = 25\nrank = 1\nkind = "sigkill"\n')

    run = nvtrain.start("--run-id", "metrics-1", str(policy))
    scrapes: list[Samples] = []
    deadline = time.monotonic() + 120
    while run.proc.poll() is None and time.monotonic() < deadline:
        got = scrape(port)
        if got is not None:
            scrapes.append(got)
        time.sleep(0.3)
    code = run.wait(timeout=30)
    assert code == 0, run.describe()
    assert scrapes, f"the metrics endpoint never answered\n{run.describe()}"

    first = scrapes[0]
    assert value(first, "nvtrain_run_info", node="0") == 1.0, sorted(first)
    steps = [v for s in scrapes if (v := value(s, "nvtrain_step")) is not None]
    assert any(0 < v < 60 for v in steps), steps  # seen mid-run, not only at the end
    restarts = [value(s, "nvtrain_restarts_total", layer="in_job") or 0.0 for s in scrapes]
    # A counter never goes down (on failure: every value, and what each scrape held)
    assert restarts == sorted(restarts), f"{restarts}\n{[sorted(s) for s in scrapes if s]}"[:20000]
    assert restarts[-1] == 1.0, restarts
    assert any(value(s, "nvtrain_recovering") == 1.0 for s in scrapes), "the recovery was never seen"
    last = scrapes[-1]
    assert value(last, "nvtrain_recovering") == 0.0
    assert value(last, "nvtrain_restarts_by_cause_total", cause="sigkill (injected)") == 1.0
    assert (value(last, "nvtrain_checkpoint_last_step") or 0) >= 20
    goodput = value(last, "nvtrain_training_goodput_ratio")
    assert goodput is not None and 0 < goodput < 1
    for stat in ("median", "p95", "max"):
        assert (value(last, "nvtrain_recovery_seconds", layer="in_job", stat=stat) or 0) > 0

    events = read_events(tmp_path / "ckpt" / "metrics-1" / "events.jsonl")
    assert events[0]["event"] == "launcher_start" and events[0]["metrics_port"] == port
    assert scrape(port) is None  # the endpoint goes with the run


def test_a_port_in_use_is_exit_2_before_anything_starts(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    _, tables = make_policy(tmp_path, module="nvtrain.demo", args=["--steps", "5"])
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        tables["metrics"] = {"enabled": True, "port": port}
        policy = write_policy(tmp_path, tables)
        run = nvtrain.start("--run-id", "metrics-busy", str(policy))
        code = run.wait(timeout=60)
    assert code == 2, run.describe()
    assert f"[metrics] port = {port}" in run.stderr and "fix:" in run.stderr, run.describe()
    assert "Traceback" not in run.stderr
    assert not run.launcher_seen(), run.describe()
    # The refused start leaves no state behind in its private TMPDIR (the resolved policy's folder).
    assert [p.name for p in nvtrain.tmpdir.glob("nvtrain-*")] == []

"""``[metrics]``: `nvtrain run` serves the run's live figures for Prometheus over real HTTP.

The demo job (2 ranks, gloo) under the real ft_launcher, with a SIGKILL injected at step 25; the
test scrapes the endpoint every 0.5 s, as Prometheus would, from the start until the exit code is
served, parses each scrape with Prometheus' own parser and checks the metrics contract
(docs/report.md) on what it got.
"""

from __future__ import annotations

import dataclasses
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nvtrain.runlog import CAUSES
from support.ports import free_port
from support.proc_helpers import NvtrainRunner, make_policy, read_events, write_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

Key = tuple[str, tuple[tuple[str, str], ...]]
SCRAPE_INTERVAL = 0.5


@dataclasses.dataclass
class Scrape:
    samples: dict[Key, float]
    """Every sample, keyed by (name, sorted labels)."""
    growing: set[Key]
    """The samples of counters and histograms: they must never go down."""


def scrape(port: int) -> Scrape | None:
    """One scrape; None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    got = Scrape({}, set())
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            got.samples[key] = s.value
            if family.type in ("counter", "histogram") and not s.name.endswith("_created"):
                got.growing.add(key)
    return got


def value(got: Scrape, name: str, **labels: str) -> float | None:
    return got.samples.get((name, tuple(sorted({"run_id": "metrics-1", **labels}.items()))))


def total(got: Scrape, name: str) -> float:
    """The sum of a counter over all its labels."""
    return sum(v for (n, _), v in got.samples.items() if n == name)


def test_the_metrics_contract_holds_on_a_real_run(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    port = free_port()
    _, tables = make_policy(
        tmp_path,
        module="nvtrain.demo",
        args=["--steps", "60", "--step-time", "0.05"],
        heartbeat={"timeout": "15s"},
        warm_start=True,  # the restart after the SIGKILL forks its workers
    )
    tables["checkpoint"].update({"interval": 10, "keep": 2})
    tables["metrics"] = {"enabled": True, "port": port, "refresh": "0.2s", "linger": "5m"}
    policy = write_policy(tmp_path, tables)
    with policy.open("a", encoding="utf-8") as f:
        f.write('[[faults]]\nstep = 25\nrank = 1\nkind = "sigkill"\n')

    run = nvtrain.start("--run-id", "metrics-1", str(policy))
    scrapes: list[Scrape] = []
    deadline = time.monotonic() + 100
    due = time.monotonic()
    # Scrape until the exit code is served: the run has ended, and nvtrain run lingers (5 min).
    while not scrapes or value(scrapes[-1], "nvtrain_exit_code") is None:
        assert run.proc.poll() is None, f"nvtrain exited before it served its exit code\n{run.describe()}"
        assert time.monotonic() < deadline, f"no exit code served within 100 s\n{run.describe()}"
        got = scrape(port)
        if got is not None:
            scrapes.append(got)
        due += SCRAPE_INTERVAL
        time.sleep(max(0.0, due - time.monotonic()))  # a scraper's cadence, as Prometheus keeps
    events = read_events(tmp_path / "ckpt" / "metrics-1")
    assert events[-1]["event"] == "launcher_exit" and events[-1]["exit_code"] == 0, events[-1]
    # The job is over and the final figures stay: scraped again, the same exit code.
    again = scrape(port)
    assert again is not None and value(again, "nvtrain_exit_code") == 0.0
    scrapes.append(again)
    # SIGTERM (the pod deleted) ends the wait at once; the exit code stays the run's.
    stopping = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 0, run.describe()
    assert time.monotonic() - stopping < 60  # not the 5 minutes of [metrics] linger
    assert scrape(port) is None  # the endpoint goes with the run
    assert "event=metrics_linger" in run.stderr, run.describe()

    # Counters and histograms never go down, and no series of theirs goes away.
    for k in range(1, len(scrapes)):
        before, after = scrapes[k - 1], scrapes[k]
        lower = {
            key: (before.samples[key], after.samples.get(key))
            for key in before.growing
            if key not in after.growing or after.samples[key] < before.samples[key]
        }
        assert not lower, f"scrape {k} of {len(scrapes)}: {lower}"

    first, last = scrapes[0], scrapes[-1]
    assert value(first, "nvtrain_run_info", node_rank="0") == 1.0, sorted(first.samples)
    # A clean run: no update of the figures failed, and nvtrain run said none did.
    assert value(last, "nvtrain_metrics_errors_total", node_rank="0") == 0.0, sorted(last.samples)
    assert "metrics: updating" not in run.stderr, run.describe()
    labels = {name for got in scrapes for _, pairs in got.samples for name, _ in pairs}
    assert "node" not in labels, labels  # Kubernetes service discovery's
    causes = {v for got in scrapes for _, pairs in got.samples for name, v in pairs if name == "cause"}
    assert causes <= set(CAUSES), causes
    steps = [v for got in scrapes if (v := value(got, "nvtrain_step")) is not None]
    assert any(0 < v < 60 for v in steps), steps  # seen mid-run, not only at the end
    assert any(value(got, "nvtrain_recovering") == 1.0 for got in scrapes), "the recovery was never seen"
    assert value(last, "nvtrain_recovering") == 0.0

    # One fault, one restart: every sum over labels counts it once.
    assert value(last, "nvtrain_restarts_total", layer="in_job", cause="sigkill") == 1.0
    assert total(last, "nvtrain_restarts_total") == 1.0
    assert (
        value(last, "nvtrain_incidents_total", cause="sigkill")
        == total(last, "nvtrain_incidents_total")
        == 1.0
    )
    assert value(last, "nvtrain_failed_restart_attempts_total") == 0.0
    assert value(last, "nvtrain_recovery_seconds_count", layer="in_job") == 1.0
    assert (value(last, "nvtrain_recovery_seconds_sum", layer="in_job") or 0) > 0
    assert (value(last, "nvtrain_checkpoint_last_step") or 0) >= 20
    saves = value(last, "nvtrain_checkpoint_saves_total") or 0
    assert 0 < (value(last, "nvtrain_checkpoint_blocked_seconds_count") or 0) <= saves
    goodput = value(last, "nvtrain_training_goodput_ratio")
    assert goodput is not None and 0 < goodput < 1

    assert events[0]["event"] == "launcher_start" and events[0]["metrics_port"] == port


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

"""The shape of the live figures (issue 40, item 5): job-level series once per job (the pod of
node rank 0), pod-level ones on every pod; counters from the first scrape; points in time as
``*_timestamp_seconds``.

Real endpoints on real sockets, scraped over HTTP and parsed with Prometheus' own parser; the
scrapes poll for the condition against a deadline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvtrain.config.schema import Metrics
from nvtrain.live import Family, LiveFigures, figures, initial_counters, serve
from nvtrain.live.pod import POD_FAMILIES, PodFigures
from nvtrain.report import build_report
from nvtrain.runlog import pod_events_file
from support.ports import free_port
from support.report_logs import Log, two_recoveries
from support.scraping import Samples, scrape, scrape_until


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def pod_log(node: int) -> Log:
    """Node ``node``'s own log: its launcher started twice (the pod was replaced), one worker failed."""
    log = (
        Log().at(0, "launcher_start", node=node).at(1, "worker_failed", node=node, local_rank=0, exit_code=1)
    )
    log.at(30, "launcher_start", node=node)
    return log.step(40, 12, first=True, pid=7).step(41, 13, pid=7)


def write(path: Path, log: Log) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in log.events), encoding="utf-8")


def test_only_node_0_serves_the_job_figures(tmp_path: Path) -> None:
    write(pod_events_file(tmp_path, 0), two_recoveries())
    write(pod_events_file(tmp_path, 1), pod_log(1))
    config = Metrics(enabled=True, port=free_port(), refresh=0.05)
    zero = serve(config, tmp_path, run_id="r", node_rank=0, address="127.0.0.1")
    one = serve(
        Metrics(enabled=True, port=free_port(), refresh=0.05),
        tmp_path,
        run_id="r",
        node_rank=1,
        address="127.0.0.1",
    )
    try:
        assert zero.job_view and not one.job_view
        job = scrape_until(
            zero.port, lambda s: {"nvtrain_step", "nvtrain_pod_step"} <= names(s), "node 0's figures"
        )
        pod = scrape_until(one.port, lambda s: "nvtrain_pod_step" in names(s), "node 1's step")
    finally:
        zero.close()
        one.close()
    # Node 1: its run info and its own figures, nothing of the job's.
    assert names(pod) == {
        "nvtrain_run_info",
        "nvtrain_pod_launcher_starts_total",
        "nvtrain_pod_worker_failures_total",
        "nvtrain_pod_step",
        "nvtrain_pod_last_step_timestamp_seconds",
        "nvtrain_pod_last_event_timestamp_seconds",
        "nvtrain_metrics_errors_total",
    }
    own = (("node_rank", "1"), ("run_id", "r"))
    assert pod[("nvtrain_metrics_errors_total", own)] == 0.0
    assert pod[("nvtrain_pod_launcher_starts_total", own)] == 2.0
    assert pod[("nvtrain_pod_worker_failures_total", own)] == 1.0
    assert pod[("nvtrain_pod_step", own)] == 13.0
    assert pod[("nvtrain_pod_last_step_timestamp_seconds", own)] == 1041.0
    assert pod[("nvtrain_pod_last_event_timestamp_seconds", own)] == 1041.0
    assert len(pod) < 10  # a handful per pod, whatever the job's size
    # Node 0: the job's figures, from every pod's log, and its own pod figures from its log only.
    assert job[("nvtrain_step", (("run_id", "r"),))] == 60.0
    assert (
        job[("nvtrain_restarts_total", (("cause", "sigkill"), ("layer", "in_job"), ("run_id", "r")))] == 1.0
    )
    assert job[("nvtrain_pod_step", (("node_rank", "0"), ("run_id", "r")))] == 60.0
    assert job[("nvtrain_pod_launcher_starts_total", (("node_rank", "0"), ("run_id", "r")))] == 1.0
    assert len(job) > 100


def test_counters_are_served_at_0_from_the_first_scrape(tmp_path: Path) -> None:
    """Before any event (the log does not exist yet), every counter of the job and of the pod is
    there at 0, for every value of its labels: the first scrape has them all."""
    report = build_report(two_recoveries().records(), "t")
    counters = {
        (f.name, tuple(sorted(labels.items())))
        for f in figures(report, 1100.0)
        if f.kind == "counter"
        for labels, _ in f.samples
    }
    early = initial_counters()
    assert {(f.name, tuple(sorted(labels.items()))) for f in early for labels, _ in f.samples} == counters
    assert all(v == 0.0 for f in early for _, v in f.samples)
    live = LiveFigures(tmp_path / "events-node0.jsonl", refresh=1.0)
    assert live.families() == []  # nothing built
    served = {
        (f.name, tuple(sorted(labels.items()))): v for f, samples in live.served() for _, labels, v in samples
    }
    assert set(served) == counters and set(served.values()) == {0.0}
    server = serve(
        Metrics(enabled=True, port=free_port(), refresh=3600.0),
        tmp_path,
        run_id="r",
        node_rank=0,
        address="127.0.0.1",
    )
    try:
        first = scrape(server.port)  # no wait: the very first scrape
    finally:
        server.close()
    assert first[("nvtrain_restarts_total", (("cause", "hang"), ("layer", "pod"), ("run_id", "r")))] == 0.0
    assert first[("nvtrain_checkpoint_saves_total", (("run_id", "r"),))] == 0.0
    assert first[("nvtrain_pod_launcher_starts_total", (("node_rank", "0"), ("run_id", "r")))] == 0.0
    assert "nvtrain_step" not in names(first)  # a gauge not known yet is left out


def gauge(families: list[Family], name: str) -> float:
    [fam] = [f for f in families if f.name == name]
    [(_, value)] = fam.samples
    return value


@pytest.mark.parametrize("now", [1100.0, 5000.0])
def test_points_in_time_are_unix_timestamps(now: float) -> None:
    """The newest step and commit as unix times (``time() - x`` in PromQL); the age gauges,
    kept for rules written against them, are ``now`` minus them."""
    got = figures(build_report(two_recoveries().records(), "t"), now)
    assert gauge(got, "nvtrain_last_step_timestamp_seconds") == 1090.5  # step 60, 90.5 s after 1000
    assert gauge(got, "nvtrain_checkpoint_last_commit_timestamp_seconds") == 1093.0
    assert gauge(got, "nvtrain_last_step_age_seconds") == now - 1090.5
    assert gauge(got, "nvtrain_checkpoint_age_seconds") == now - 1093.0


def test_pod_figures_follow_their_own_log(tmp_path: Path) -> None:
    path = tmp_path / "events-node2.jsonl"
    pod = PodFigures(path)
    assert pod.update() is False  # not there yet
    assert {n for n, *_ in pod.values()} == {"nvtrain_pod_launcher_starts", "nvtrain_pod_worker_failures"}
    write(path, pod_log(2))
    assert pod.update() is True and pod.update() is False
    values = {n: v for n, _, _, v in pod.values()}
    assert values == {
        "nvtrain_pod_launcher_starts": 2.0,
        "nvtrain_pod_worker_failures": 1.0,
        "nvtrain_pod_step": 13.0,
        "nvtrain_pod_last_step_timestamp_seconds": 1041.0,
        "nvtrain_pod_last_event_timestamp_seconds": 1041.0,
    }
    assert {n.removeprefix("nvtrain_") for n in values} == set(POD_FAMILIES)

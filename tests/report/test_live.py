"""Live figures (``[metrics]``): the report's figures as Prometheus metrics, and their endpoint."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from report_logs import CPU_LOG, Log, two_recoveries, typed

from nvtrain.config.schema import Metrics
from nvtrain.report import build_report, read_report
from nvtrain.report.live import BUILD_SHARE, Family, LiveFigures, bind_address, figures, serve


def flat(families: list[Family]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(f.name, tuple(sorted(labels.items()))): v for f in families for labels, v in f.samples}


def test_the_figures_of_a_finished_run() -> None:
    """two_recoveries(): 100 s, 60 kept steps at 1 s, recoveries of 4 s (in-process) and 13 s."""
    got = flat(figures(build_report(two_recoveries().records(), "t"), now=1100.0))
    assert got[("nvtrain_job_seconds", ())] == 100.0
    assert got[("nvtrain_step", ())] == 60.0
    assert got[("nvtrain_training_goodput_ratio", ())] == pytest.approx(0.6)
    assert got[("nvtrain_kept_steps", ())] == 60.0 and got[("nvtrain_lost_steps", ())] == 10.0
    assert got[("nvtrain_incidents", ())] == 2.0 and got[("nvtrain_recovering", ())] == 0.0
    assert got[("nvtrain_restarts", (("layer", "in_job"),))] == 1.0
    assert got[("nvtrain_restarts", (("layer", "in_process"),))] == 1.0
    assert got[("nvtrain_recovery_seconds", (("layer", "in_process"), ("stat", "median")))] == 4.0
    assert got[("nvtrain_recovery_seconds", (("layer", "in_job"), ("stat", "max")))] == 13.0
    assert got[("nvtrain_last_recovery_seconds", ())] == 13.0
    assert got[("nvtrain_checkpoint_saves", (("result", "committed"),))] == 6.0
    assert got[("nvtrain_checkpoint_blocked_seconds", (("stat", "median"),))] == 0.5
    assert got[("nvtrain_checkpoint_last_step", ())] == 60.0
    assert got[("nvtrain_checkpoint_age_seconds", ())] == pytest.approx(7.0)  # committed at 93 s
    assert got[("nvtrain_checkpoint_age_steps", ())] == 0.0
    assert got[("nvtrain_last_step_age_seconds", ())] == pytest.approx(9.5)  # last step at 90.5 s
    assert got[("nvtrain_exit_code", ())] == 0.0


def test_the_figures_agree_with_the_report_of_a_real_run() -> None:
    report = read_report(CPU_LOG)
    got = flat(figures(report, now=report.start_ts + report.time.total))
    assert got[("nvtrain_training_goodput_ratio", ())] == report.training_goodput
    assert got[("nvtrain_infrastructure_goodput_ratio", ())] == report.infrastructure_goodput
    for layer, count in report.restarts_by_layer.items():
        assert got[("nvtrain_restarts", (("layer", layer),))] == count
    assert got[("nvtrain_failed_restart_attempts", ())] == report.failed_attempts
    assert got[("nvtrain_step", ())] == report.final_step == 120


def test_mid_recovery_and_unknown_figures() -> None:
    """Cut two_recoveries() just after the SIGKILL: recovering, no exit code yet."""
    events = [e for e in two_recoveries().records() if e.ts <= 1058.5]
    got = flat(figures(build_report(events, "t"), now=1060.0))
    assert got[("nvtrain_recovering", ())] == 1.0
    assert ("nvtrain_exit_code", ()) not in got
    assert got[("nvtrain_step", ())] == 45.0  # where the fault fired
    assert got[("nvtrain_checkpoint_age_steps", ())] == 5.0  # step 45 reached, 40 committed
    # Before any step, step figures are absent rather than zero.
    start = flat(figures(build_report(Log().at(0, "launcher_start", node=0).records(), "t"), now=1001.0))
    assert ("nvtrain_step", ()) not in start and ("nvtrain_training_goodput_ratio", ()) not in start
    assert start[("nvtrain_recovering", ())] == 0.0


def test_live_figures_follow_a_growing_log(tmp_path: Path) -> None:
    events = two_recoveries().events
    path = tmp_path / "events.jsonl"
    first, rest = events[:20], events[20:]
    _write(path, first)
    live = LiveFigures(path, refresh=5.0, clock=lambda: 1100.0)
    assert live.report() is None and live.families() == []  # nothing built yet
    assert live.update() is True
    before = live.report()
    assert before is not None and before.final_step == build_report(typed(first), "t").final_step == 30
    assert live.update() is False and live.report() is before  # nothing new: not rebuilt
    _write(path, rest, append=True)
    assert live.update() is True
    after = live.report()
    assert after is not None and after.final_step == 60 and after.exit_code == 0
    assert flat(live.families()) == flat(figures(build_report(typed(events), "t"), now=1100.0))

    missing = LiveFigures(tmp_path / "none.jsonl", refresh=1.0)
    assert missing.update() is False and missing.report() is None and missing.families() == []


def test_slow_rebuilds_are_spaced_out(tmp_path: Path) -> None:
    """After a build of b seconds the next waits b / BUILD_SHARE, and never less than refresh."""
    path = tmp_path / "events.jsonl"
    # 20,000 events: a build takes long enough to measure on any machine.
    log = Log()
    for i in range(10_000):
        log.step(float(i), i + 1, first=i == 0).step(float(i), i + 1, pid=2, first=i == 0)
    _write(path, log.events)
    live = LiveFigures(path, refresh=0.001)
    assert live.pause() == 0.001
    start = time.perf_counter()
    live.update()
    took = time.perf_counter() - start
    # The build is part of the update (which also reads the file): 4 x the build time is more
    # than the 1 ms refresh and at most 4 x the whole update.
    assert 0.01 < live.pause() <= took / BUILD_SHARE
    assert LiveFigures(path, refresh=3600.0).pause() == 3600.0


def _write(path: Path, events: list[dict], append: bool = False) -> None:
    with path.open("a" if append else "w", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_endpoint_serves_the_figures_in_prometheus_format(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _write(path, two_recoveries().events)
    server = serve(Metrics(enabled=True, port=_free_port()), path, run_id="r", node=3, address="127.0.0.1")
    try:
        # The first build runs in the server's own thread: a scrape before it ends has no figures.
        deadline = time.monotonic() + 20
        text = ""
        while "nvtrain_step{" not in text and time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as reply:
                text = reply.read().decode()
            time.sleep(0.05)
    finally:
        server.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("nvtrain_run_info", (("node", "3"), ("run_id", "r")))] == 1.0
    assert samples[("nvtrain_restarts_total", (("layer", "in_job"), ("run_id", "r")))] == 1.0
    assert samples[("nvtrain_step", (("run_id", "r"),))] == 60.0
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=2)


def test_a_port_in_use_is_an_os_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with pytest.raises(OSError):
            serve(
                Metrics(enabled=True, port=port),
                tmp_path / "e.jsonl",
                run_id="r",
                node=0,
                address="127.0.0.1",
            )


def test_saves_in_flight_at_faults_are_counted() -> None:
    log = two_recoveries()
    log.at(29.1, "checkpoint_settled", step=20, pid=1, rank=0, waited_s=0.4, finished=True)
    log.events.sort(key=lambda e: e["ts"])
    got = flat(figures(build_report(log.records(), "t"), now=1100.0))
    assert got[("nvtrain_checkpoint_in_flight_at_faults", (("result", "finished"),))] == 1.0
    assert got[("nvtrain_checkpoint_in_flight_at_faults", (("result", "dropped"),))] == 0.0
    plain = flat(figures(build_report(two_recoveries().records(), "t"), now=1100.0))
    assert not any(name == "nvtrain_checkpoint_in_flight_at_faults" for name, _ in plain)


def test_the_bind_address_follows_the_pod_ip_family() -> None:
    assert bind_address("2001:db8::7") == "::"
    assert bind_address("10.0.3.7") == bind_address(None) == bind_address("") == "0.0.0.0"


def test_an_ipv6_pod_serves_on_every_ipv6_address(tmp_path: Path) -> None:
    try:
        server = serve(
            Metrics(enabled=True, port=_free_port()), tmp_path / "e.jsonl", run_id="r", node=0, address="::"
        )
    except OSError as exc:  # a kernel without IPv6
        pytest.skip(f"no IPv6 here: {exc}")
    try:
        with urllib.request.urlopen(f"http://[::1]:{server.port}/metrics", timeout=5) as reply:
            assert b"nvtrain_run_info" in reply.read()
    finally:
        server.close()


def test_an_unreadable_log_does_not_stop_the_updates(tmp_path: Path) -> None:
    """The log is briefly not a readable file (shared storage hiccup): the figures catch up after."""
    path = tmp_path / "events.jsonl"
    path.mkdir()  # reading it fails (IsADirectoryError)
    server = serve(
        Metrics(enabled=True, port=_free_port(), refresh=0.1), path, run_id="r", node=0, address="127.0.0.1"
    )
    try:
        time.sleep(0.5)  # a few failed updates
        path.rmdir()
        _write(path, two_recoveries().events)
        deadline = time.monotonic() + 20
        text = ""
        while "nvtrain_step{" not in text and time.monotonic() < deadline:
            time.sleep(0.1)
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as reply:
                text = reply.read().decode()
    finally:
        server.close()
    assert 'nvtrain_step{run_id="r"} 60.0' in text

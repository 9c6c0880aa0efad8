"""Live figures (``[metrics]``): the report's figures as Prometheus metrics, and their endpoint."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nvtrain.config.schema import Metrics
from nvtrain.events import read_events
from nvtrain.events.records import Event, MetricsLinger
from nvtrain.launcher.supervisor import linger, lingers
from nvtrain.live import (
    BUILD_SHARE,
    LAYERS,
    Family,
    LiveFigures,
    Sample,
    bind_address,
    figures,
    serve,
)
from nvtrain.live.pod import POD_FAMILIES
from nvtrain.report import build_report, read_report
from nvtrain.runlog import CAUSES
from support.ports import free_port
from support.report_logs import CPU_LOG, REAL_LOGS, Log, two_recoveries, typed

Flat = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def flat(families: list[Family]) -> Flat:
    """Every sample as served, keyed by (name with its suffix, sorted labels)."""
    return {
        (f.name + suffix, tuple(sorted(labels.items()))): v
        for f in families
        for suffix, labels, v in f.series()
    }


def flat_served(served: list[tuple[Family, list[Sample]]]) -> Flat:
    return {
        (f.name + suffix, tuple(sorted(labels.items()))): v
        for f, samples in served
        for suffix, labels, v in samples
    }


def growing(families: list[Family]) -> Flat:
    """The samples of the counters and histograms: what must never go down."""
    return flat([f for f in families if f.kind != "gauge"])


def test_the_figures_of_a_finished_run() -> None:
    """two_recoveries(): 100 s, 60 kept steps at 1 s, recoveries of 4 s (in-process) and 13 s."""
    got = flat(figures(build_report(two_recoveries().records(), "t"), now=1100.0))
    assert got[("nvtrain_job_seconds", ())] == 100.0
    assert got[("nvtrain_step", ())] == 60.0
    assert got[("nvtrain_training_goodput_ratio", ())] == pytest.approx(0.6)
    assert got[("nvtrain_kept_steps", ())] == 60.0 and got[("nvtrain_lost_steps", ())] == 10.0
    assert got[("nvtrain_incidents", (("cause", "exception"),))] == 1.0
    assert got[("nvtrain_incidents", (("cause", "sigkill"),))] == 1.0
    assert got[("nvtrain_recovering", ())] == 0.0 and got[("nvtrain_recovery_restarts", ())] == 0.0
    assert got[("nvtrain_restarts", (("cause", "sigkill"), ("layer", "in_job")))] == 1.0
    assert got[("nvtrain_restarts", (("cause", "exception"), ("layer", "in_process")))] == 1.0
    # Every other (layer, cause) is there at 0: one restart each, counted once.
    restarts = {k: v for k, v in got.items() if k[0] == "nvtrain_restarts"}
    assert len(restarts) == len(LAYERS) * len(CAUSES) and sum(restarts.values()) == 2.0
    assert got[("nvtrain_failed_restart_attempts", ())] == 0.0
    # Recovery times are histograms: 4 s (in-process) and 13 s (in-job).
    assert got[("nvtrain_recovery_seconds_bucket", (("layer", "in_process"), ("le", "2.5")))] == 0.0
    assert got[("nvtrain_recovery_seconds_bucket", (("layer", "in_process"), ("le", "5.0")))] == 1.0
    assert got[("nvtrain_recovery_seconds_bucket", (("layer", "in_job"), ("le", "10.0")))] == 0.0
    assert got[("nvtrain_recovery_seconds_bucket", (("layer", "in_job"), ("le", "30.0")))] == 1.0
    assert got[("nvtrain_recovery_seconds_bucket", (("layer", "in_job"), ("le", "+Inf")))] == 1.0
    assert got[("nvtrain_recovery_seconds_sum", (("layer", "in_job"),))] == 13.0
    assert got[("nvtrain_recovery_phase_seconds_sum", (("layer", "in_job"), ("phase", "restore")))] == 4.0
    assert (
        "nvtrain_recovery_phase_seconds_sum",
        (("layer", "in_process"), ("phase", "rendezvous")),
    ) not in got
    assert got[("nvtrain_rollback_steps_bucket", (("le", "5.0"),))] == 2.0  # 5 steps each
    assert got[("nvtrain_rollback_steps_bucket", (("le", "2.0"),))] == 0.0
    assert got[("nvtrain_last_recovery_seconds", ())] == 13.0
    assert got[("nvtrain_checkpoint_saves", ())] == 6.0 and got[("nvtrain_checkpoint_commits", ())] == 6.0
    assert {
        got[("nvtrain_checkpoint_problems", (("problem", p),))] for p in ("failed", "partial", "corrupt")
    } == {0}
    assert got[("nvtrain_checkpoint_blocked_seconds_bucket", (("le", "0.5"),))] == 6.0  # 0.5 s each
    assert got[("nvtrain_checkpoint_blocked_seconds_bucket", (("le", "0.25"),))] == 0.0
    assert got[("nvtrain_checkpoint_blocked_seconds_sum", ())] == 3.0
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
        assert (
            sum(
                v
                for (name, labels), v in got.items()
                if name == "nvtrain_restarts" and ("layer", layer) in labels
            )
            == count
        )
    incidents = sum(v for (name, _), v in got.items() if name == "nvtrain_incidents")
    assert incidents == len(report.incidents) == 2
    assert got[("nvtrain_failed_restart_attempts", ())] == report.failed_attempts
    recovered = [i.seconds for i in report.incidents if i.seconds is not None]
    assert got[("nvtrain_recovery_seconds_sum", (("layer", "in_process"),))] == pytest.approx(recovered[0])
    assert got[("nvtrain_step", ())] == report.final_step == 120


def test_mid_recovery_and_unknown_figures() -> None:
    """Cut two_recoveries() just after the SIGKILL: recovering, no exit code yet."""
    events = [e for e in two_recoveries().records() if e.ts <= 1058.5]
    got = flat(figures(build_report(events, "t"), now=1060.0))
    assert got[("nvtrain_recovering", ())] == 1.0
    assert got[("nvtrain_recovery_restarts", ())] == 0.0  # detected, not restarted yet
    restarted = [e for e in two_recoveries().records() if e.ts <= 1059.5]
    later = flat(figures(build_report(restarted, "t"), now=1060.0))
    assert later[("nvtrain_recovery_restarts", ())] == 1.0  # the in-job restart, in progress
    assert later[("nvtrain_failed_restart_attempts", ())] == 0.0  # it has not failed (yet)
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


def test_the_endpoint_serves_the_figures_in_prometheus_format(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _write(path, two_recoveries().events)
    server = serve(
        Metrics(enabled=True, port=free_port()), path, run_id="r", node_rank=0, address="127.0.0.1"
    )
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
    assert samples[("nvtrain_run_info", (("node_rank", "0"), ("run_id", "r")))] == 1.0
    assert (
        samples[("nvtrain_restarts_total", (("cause", "sigkill"), ("layer", "in_job"), ("run_id", "r")))]
        == 1.0
    )
    assert samples[("nvtrain_restarts_total", (("cause", "hang"), ("layer", "pod"), ("run_id", "r")))] == 0.0
    assert samples[("nvtrain_step", (("run_id", "r"),))] == 60.0
    in_job = (("layer", "in_job"), ("run_id", "r"))
    assert samples[("nvtrain_recovery_seconds_count", in_job)] == 1.0
    assert samples[("nvtrain_recovery_seconds_sum", in_job)] == 13.0
    assert (
        samples[("nvtrain_recovery_seconds_bucket", (("layer", "in_job"), ("le", "30.0"), ("run_id", "r")))]
        == 1.0
    )
    assert samples[("nvtrain_exit_code", (("run_id", "r"),))] == 0.0
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
                node_rank=0,
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
    assert (
        plain[("nvtrain_checkpoint_in_flight_at_faults", (("result", "finished"),))] == 0.0
    )  # counters start at 0


def test_the_bind_address_follows_the_pod_ip_family() -> None:
    assert bind_address("2001:db8::7") == "::"
    assert bind_address("10.0.3.7") == bind_address(None) == bind_address("") == "0.0.0.0"


def test_an_ipv6_pod_serves_on_every_ipv6_address(tmp_path: Path) -> None:
    try:
        server = serve(
            Metrics(enabled=True, port=free_port()),
            tmp_path / "e.jsonl",
            run_id="r",
            node_rank=0,
            address="::",
        )
    except OSError as exc:  # a kernel without IPv6
        pytest.skip(f"no IPv6 here: {exc}")
    try:
        with urllib.request.urlopen(f"http://[::1]:{server.port}/metrics", timeout=5) as reply:
            assert b"nvtrain_run_info" in reply.read()
    finally:
        server.close()


@pytest.mark.parametrize("source", [*REAL_LOGS, "two_recoveries"], ids=lambda s: getattr(s, "name", s))
def test_counters_never_go_down_as_a_log_grows(source: Path | str) -> None:
    """Each real log read one more line at a time, as the live figures read a growing log: no
    counter or histogram series goes down or goes away (without ``_HighWater``'s help). The
    labels of the restart and incident counters split what they count: an incident is counted
    once it has ended, with each of its restarts once."""
    events = two_recoveries().records() if source == "two_recoveries" else list(read_events(Path(source)))
    before: Flat = {}
    for k in range(1, len(events) + 1):
        report = build_report(events[:k], "t")
        now = growing(figures(report, now=report.start_ts + report.time.total))
        lower = {key: (v, now.get(key)) for key, v in before.items() if now.get(key, -1.0) < v}
        assert not lower, f"after line {k}: {lower}"
        ended = [i for i in report.incidents if i.recovered or report.finished]
        restarts = sum(v for (name, _), v in now.items() if name == "nvtrain_restarts")
        assert restarts == sum(n for i in ended for n in i.restarts.values())
        assert sum(v for (name, _), v in now.items() if name == "nvtrain_incidents") == len(ended)
        before = now
    # The whole log: every incident and restart, as the report counts them.
    assert report.finished and report.exit_code == 0
    assert restarts == sum(report.restarts_by_layer.values()) > 0
    assert before[("nvtrain_failed_restart_attempts", ())] == report.failed_attempts
    assert before[("nvtrain_lost_steps", ())] == report.lost_steps


def test_a_count_that_comes_out_lower_is_served_at_its_highest(tmp_path: Path) -> None:
    """An event written late by another process, stamped before the first step that ended a
    recovery, changes that recovery's cause (a worker's exit, then the SIGKILL that caused it):
    the counters of the old cause come out lower, and are served at their highest."""
    path = tmp_path / "events.jsonl"
    log = Log().at(0, "launcher_start", node=0).step(1, 1, first=True).step(10, 10)
    log.at(11, "worker_failed", node=0, local_rank=1, exit_code=1, signal=None)
    log.at(11.1, "restart_begin", layer="in_job", node=0, attempts_left=2)
    log.step(20, 1, first=True, pid=3)
    log.write(path)
    live = LiveFigures(path, refresh=1.0)
    assert live.update()
    was = ("nvtrain_incidents", (("cause", "exit"),))
    assert flat_served(live.served())[was] == flat(live.families())[was] == 1.0
    late = Log().at(10.9, "worker_failed", node=0, local_rank=0, exit_code=-9, signal="SIGKILL")
    with path.open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in late.events)
    assert live.update()
    computed, served = flat(live.families()), flat_served(live.served())
    assert computed[was] == 0.0 and served[was] == 1.0
    now = ("nvtrain_incidents", (("cause", "sigkill"),))
    assert computed[now] == served[now] == 1.0
    # Nothing served goes away, and a histogram's buckets stay cumulative.
    assert set(served) >= set(computed)
    buckets = [v for (name, _), v in served.items() if name == "nvtrain_recovery_seconds_bucket"]
    assert buckets == sorted(buckets) and buckets[-1] == 1.0


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def test_the_final_figures_are_served_until_a_signal(tmp_path: Path) -> None:
    """``linger`` reads the log to its end at once (the next refresh is an hour away), so the
    exit code is served; SIGTERM ends the wait long before its 60 s."""
    path = tmp_path / "events.jsonl"
    events = two_recoveries().events
    _write(path, events[:-1])  # everything but the launcher's exit
    server = serve(
        Metrics(enabled=True, port=free_port(), refresh=3600.0),
        path,
        run_id="r",
        node_rank=0,
        address="127.0.0.1",
    )
    shown: list[Event] = []
    served_exit = threading.Event()

    def stop_once_served() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not served_exit.is_set():
            if 'nvtrain_exit_code{run_id="r"} 0.0' in _scrape(server.port):
                served_exit.set()
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # linger's handler takes it

    previous = signal.getsignal(signal.SIGTERM)
    try:
        text = ""
        deadline = time.monotonic() + 20
        while "nvtrain_step{" not in text and time.monotonic() < deadline:
            text = _scrape(server.port)  # the first build
        assert "nvtrain_step{" in text and "nvtrain_exit_code" not in text
        _write(path, events[-1:], append=True)
        stopper = threading.Thread(target=stop_once_served)
        stopper.start()
        start = time.monotonic()
        linger(server, 60.0, shown.append)
        took = time.monotonic() - start
        stopper.join()
    finally:
        server.close()
    assert served_exit.is_set()
    assert took < 30.0  # ended by SIGTERM, not by its 60 s
    assert shown == [MetricsLinger(port=server.port, seconds=60.0)]
    assert signal.getsignal(signal.SIGTERM) == previous


def test_only_a_run_that_ended_for_good_lingers() -> None:
    """Exit 0 (the index is complete) and 2 or 4 (the Job fails) linger; after 1 or 3 Kubernetes
    replaces the pod, which must not wait; a run stopped by a signal never lingers."""
    assert [code for code in (0, 1, 2, 3, 4, 143) if lingers(code, None)] == [0, 2, 4]
    assert not lingers(0, signal.SIGTERM) and not lingers(None, None)


def test_lingering_ends_after_its_time(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _write(path, two_recoveries().events)
    server = serve(
        Metrics(enabled=True, port=free_port()), path, run_id="r", node_rank=0, address="127.0.0.1"
    )
    try:
        start = time.monotonic()
        linger(server, 0.3, lambda record: None)
        took = time.monotonic() - start
        assert 'nvtrain_exit_code{run_id="r"} 0.0' in _scrape(server.port)  # read by linger
    finally:
        server.close()
    assert 0.3 <= took < 10.0


def test_the_contract_table_lists_every_metric_with_its_type() -> None:
    """docs/report.md's "Metrics contract" table and the figures of a run that has them all."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text(encoding="utf-8")
    table = doc[doc.index("| metric | type | labels | meaning |") :].split("\n\n")[0]
    documented: dict[str, tuple[str, tuple[str, ...]]] = {}
    for row in table.splitlines()[2:]:
        names, kind, labels = (cell.strip() for cell in row.strip("|").split("|")[:3])
        for name in names.replace("`", "").split(", "):
            documented[name] = (
                kind.split()[0],
                tuple(sorted(labels.replace("`", "").split(", "))) if labels else (),
            )
    log = two_recoveries()
    log.at(29.1, "checkpoint_settled", step=20, pid=1, rank=0, waited_s=0.4, finished=True)
    log.events.sort(key=lambda e: e["ts"])
    report = build_report(log.records(), "t")
    served = {
        f.name + ("_total" if f.kind == "counter" else ""): (
            f.kind,
            tuple(sorted({k for labels, _ in f.samples for k in labels})),
        )
        for f in figures(report, now=1100.0)
    }
    served["nvtrain_run_info"] = ("gauge", ("node_rank", "run_id"))  # serve() adds it
    served["nvtrain_metrics_errors_total"] = ("counter", ("node_rank",))  # and this (live/errors.py)
    for name, (kind, _) in POD_FAMILIES.items():  # every pod's own (live/pod.py)
        served[f"nvtrain_{name}" + ("_total" if kind == "counter" else "")] = (kind, ("node_rank",))
    assert served == documented

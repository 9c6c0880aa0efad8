"""A failed update of the live figures is seen: counted in ``nvtrain_metrics_errors_total``,
logged once per distinct error (logger ``nvtrain.live``, shown on ``nvtrain run``'s stderr), and
the endpoint goes on serving. Real servers, real scrapes, a real log that cannot be read."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nvtrain.config.schema import Metrics
from nvtrain.live import serve
from nvtrain.live.errors import MAX_LOGGED, UpdateErrors
from support.ports import free_port
from support.report_logs import two_recoveries
from support.scraping import scrape, scrape_until

ERRORS = ("nvtrain_metrics_errors_total", (("node_rank", "0"), ("run_id", "r")))


def live_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "nvtrain.live"]


def test_the_error_counter_is_served_at_0_from_the_first_scrape(tmp_path: Path) -> None:
    """A log that does not exist yet is no error (the run has not written it)."""
    server = serve(
        Metrics(enabled=True, port=free_port(), refresh=0.1),
        tmp_path / "events.jsonl",
        run_id="r",
        node_rank=0,
        address="127.0.0.1",
    )
    try:
        assert scrape(server.port)[ERRORS] == 0.0
        server.catch_up()  # an update that finds nothing: not an error either
        assert scrape(server.port)[ERRORS] == 0.0 and server.errors == 0
    finally:
        server.close()


def test_a_failed_update_is_counted_logged_once_and_serving_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The log is a folder (reading it fails, IsADirectoryError, at every refresh, for the job's
    figures and the pod's): one warning, a counter that grows, and a scrape still answers; once
    the log is a file the figures catch up, and the counter stays where it was."""
    caplog.set_level(logging.WARNING, logger="nvtrain.live")
    path = tmp_path / "events.jsonl"
    path.mkdir()
    server = serve(
        Metrics(enabled=True, port=free_port(), refresh=0.1),
        path,
        run_id="r",
        node_rank=0,
        address="127.0.0.1",
    )
    try:
        failing = scrape_until(server.port, lambda s: s.get(ERRORS, 0.0) >= 4, "4 failed updates")
        assert ("nvtrain_run_info", (("node_rank", "0"), ("run_id", "r"))) in failing
        assert ("nvtrain_step", (("run_id", "r"),)) not in failing
        server.catch_up()  # fails the same way: counted, not logged again
        logged = live_warnings(caplog)
        assert len(logged) == 1, logged
        assert logged[0].startswith("metrics: updating the job figures failed: IsADirectoryError: ")
        assert str(path) in logged[0] and "nvtrain_metrics_errors_total" in logged[0]
        record = next(r for r in caplog.records if r.name == "nvtrain.live")
        assert record.levelno == logging.WARNING and record.exc_info is not None  # the traceback
        path.rmdir()
        path.write_text("".join(json.dumps(e) + "\n" for e in two_recoveries().events), encoding="utf-8")
        served = scrape_until(
            server.port, lambda s: ("nvtrain_step", (("run_id", "r"),)) in s, "the figures after the error"
        )
        counted = server.errors
    finally:
        server.close()
    assert served[("nvtrain_step", (("run_id", "r"),))] == 60.0
    assert 4 <= served[ERRORS] <= counted
    assert len(live_warnings(caplog)) == 1  # recovered: nothing more to say


def test_each_distinct_error_is_logged_once_up_to_a_limit(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="nvtrain.live")
    errors = UpdateErrors()

    class Failing:
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        def update(self) -> bool:
            raise self.exc

    for exc in (OSError("stale file handle"), OSError("stale file handle"), KeyError("step")):
        errors.update(Failing(exc), "pod")
    assert errors.count == 3
    assert live_warnings(caplog) == [
        "metrics: updating the pod figures failed: OSError: stale file handle (logged once; every "
        "failed update counts in nvtrain_metrics_errors_total; the figures stay as they were and "
        "the endpoint goes on serving)",
        "metrics: updating the pod figures failed: KeyError: 'step' (logged once; every failed "
        "update counts in nvtrain_metrics_errors_total; the figures stay as they were and the "
        "endpoint goes on serving)",
    ]
    for n in range(3 * MAX_LOGGED):  # distinct messages (an offset, a path): the log stays short
        errors.update(Failing(ValueError(f"bad offset {n}")), "job")
    logged = live_warnings(caplog)
    assert len(logged) == MAX_LOGGED + 1 and errors.count == 3 + 3 * MAX_LOGGED
    assert logged[-1] == f"metrics: {MAX_LOGGED} distinct update errors logged; further ones are only counted"


def test_nvtrain_runs_stderr_shows_a_failed_update_once(tmp_path: Path) -> None:
    """In a process of its own, as in ``nvtrain run``: the reporter that ``run`` prints its
    events with also prints the library's warnings, so a failed update is one
    ``nvtrain: warning:`` line on stderr, however many updates fail."""
    log = tmp_path / "events.jsonl"
    log.mkdir()
    code = f"""
        import time
        from pathlib import Path
        from nvtrain.cli.render.events import event_reporter
        from nvtrain.config.schema import Metrics
        from nvtrain.live import serve

        report = event_reporter()
        server = serve(
            Metrics(enabled=True, port={free_port()}, refresh=0.05),
            Path({str(log)!r}), run_id="r", node_rank=0, address="127.0.0.1",
        )
        deadline = time.monotonic() + 30
        while server.errors < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        server.close()
        print(server.errors)
        """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) >= 4
    lines = result.stderr.splitlines()
    assert lines == [
        f"nvtrain: warning: metrics: updating the job figures failed: IsADirectoryError: [Errno 21] Is a "
        f"directory: '{log}' (logged once; every failed update counts in nvtrain_metrics_errors_total; "
        "the figures stay as they were and the endpoint goes on serving)"
    ], result.stderr

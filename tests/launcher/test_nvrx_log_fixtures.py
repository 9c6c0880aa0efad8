"""Real ft_launcher logs of NVRx 0.4.1, 0.6.0 and 0.7.0 through the log watcher.

``tests/launcher/nvrx_logs/<version>/<scenario>.log`` are whole logs recorded by
``benchmarks/recovery/record_nvrx_logs.sh`` (README.md there says where and how). Every line of
every log goes through ``parse_line``; the events it recognises, in order, must be those written
by hand in ``expected.json``. A few checks below restate what each scenario did (rank 1 fails,
SIGKILL means -9, ...) so that an expectation rewritten from a wrong parse does not pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nvtrain.launcher.logwatch import RENDEZVOUS_TIMEOUT, parse_line

FIXTURES = Path(__file__).resolve().parent / "nvrx_logs"
EXPECTED: dict[str, Any] = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))
VERSIONS = ("0.4.1", "0.6.0", "0.7.0")
SCENARIOS = (
    "success",
    "exit3_restart",
    "sigkill_restart",
    "hang_restart",
    "restarts_exhausted",
    "rendezvous_timeout",
    "sigterm",
)
VOLATILE = frozenset({"worker_pid", "message"})
"""Fields that differ from run to run (pids; messages with pids, host names, seconds)."""

Recognised = tuple[str, dict[str, Any]]


def _recognised(line: str) -> Recognised | None:
    """``(event, fields)`` without volatile and None fields, for a line ``parse_line`` knows."""
    parsed: Any = parse_line(line)
    if parsed is None:
        return None
    if isinstance(parsed, tuple):
        name, fields = parsed
    else:  # a typed event record (a global rank, which NVRx 0.4's hang line gives, is its `rank`)
        name, fields = parsed.name, {"rank": parsed.rank, **parsed.fields()}
    return name, {k: v for k, v in fields.items() if k not in VOLATILE and v is not None}


def _events(version: str, scenario: str) -> list[Recognised]:
    text = (FIXTURES / version / f"{scenario}.log").read_text(encoding="utf-8")
    return [event for line in text.splitlines() if (event := _recognised(line)) is not None]


CASES = [(version, scenario) for version in VERSIONS for scenario in SCENARIOS]


def test_every_log_has_expectations() -> None:
    logs = {(path.parent.name, path.stem) for path in FIXTURES.glob("*/*.log")}
    expected = {(v, s) for v, runs in EXPECTED.items() if not v.startswith("_") for s in runs}
    assert logs == expected == set(CASES)


@pytest.mark.parametrize(("version", "scenario"), CASES)
def test_recognised_events(version: str, scenario: str) -> None:
    expected = [(name, fields) for name, fields in EXPECTED[version][scenario]]
    assert _events(version, scenario) == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_rendezvous_joined_is_recognised(version: str) -> None:
    # One round in a clean run, a second one after each restart.
    assert [name for name, _ in _events(version, "success")] == ["rendezvous_done"]
    joined = [f for name, f in _events(version, "exit3_restart") if name == "rendezvous_done"]
    assert len(joined) == 2 and all(f["group_rank"] == 0 and f["nodes"] == 1 for f in joined)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("scenario", "exit_code", "signal"),
    [("exit3_restart", 3, None), ("sigkill_restart", -9, "SIGKILL"), ("hang_restart", -9, "SIGKILL")],
)
def test_failure_then_restart(version: str, scenario: str, exit_code: int, signal: str | None) -> None:
    names = [name for name, _ in _events(version, scenario)]
    failed = names.index("worker_failed")
    _, fields = _events(version, scenario)[failed]
    assert fields["local_rank"] == 1 and fields["exit_code"] == exit_code
    assert fields.get("signal") == signal
    # The restart follows the failure, with the whole budget (--max-restarts=3) still left.
    assert names[failed + 1] == "restart_begin"
    assert _events(version, scenario)[failed + 1][1]["attempts_left"] == 3
    assert names.count("worker_failed") == 1 and names.count("restart_begin") == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_hang_is_detected_for_the_hung_rank(version: str) -> None:
    events = _events(version, "hang_restart")
    hangs = [fields for name, fields in events if name == "hang_detected"]
    # NVRx 0.4 names the worker by its global rank, 0.6/0.7 by its local rank (one node: both 1).
    key = "rank" if version == "0.4.1" else "local_rank"
    assert hangs == [{key: 1, "heartbeat": "subsequent"}]
    # ... before the launcher sees the rank the monitor killed.
    names = [name for name, _ in events]
    assert names.index("hang_detected") < names.index("worker_failed")


@pytest.mark.parametrize("version", VERSIONS)
def test_restarts_exhausted(version: str) -> None:
    events = _events(version, "restarts_exhausted")
    restarts = [fields for name, fields in events if name == "restart_begin"]
    assert restarts == [{"layer": "in_job", "attempts_left": 1, "max_restarts": 1}]
    failed_at = [i for i, (name, _) in enumerate(events) if name == "worker_failed"]
    assert len(failed_at) >= 2 and {events[i][1]["exit_code"] for i in failed_at} == {3}
    # The second failure ends the run: no restart after it.
    assert "restart_begin" not in [name for name, _ in events[failed_at[1] :]]


@pytest.mark.parametrize("version", VERSIONS)
def test_rendezvous_timeout(version: str) -> None:
    assert _events(version, "rendezvous_timeout") == [("launcher_error", {"error": RENDEZVOUS_TIMEOUT})]


@pytest.mark.parametrize("version", VERSIONS)
def test_sigterm_to_the_launcher(version: str) -> None:
    events = _events(version, "sigterm")
    assert ("launcher_error", {"error": "SignalException"}) == events[-1]
    signals = {fields.get("signal") for name, fields in events if name == "worker_failed"}
    assert signals == {"SIGTERM"}
    assert "restart_begin" not in [name for name, _ in events]

"""Derived defaults: a key left out never contradicts a key the policy sets (docs/policy.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nvtrain.config import Policy, validate_source
from nvtrain.nvrx import NvrxVersion

NVRX = NvrxVersion.parse("0.7.0")
JOB = '[job]\nname = "x"\nscript = "t.py"\n'


def _valid(extra: str, job: str = JOB) -> Policy:
    result = validate_source(job + extra, "p.toml", nvrx=NVRX)
    bad = [f"{f.code} {f.where}: {f.rule}" for f in result.findings if f.severity in ("error", "warning")]
    assert result.policy is not None and not bad, bad
    return result.policy


def _codes(text: str) -> list[tuple[str, str]]:
    result = validate_source(text, "p.toml", nvrx=NVRX)
    return [(f.code, f.where) for f in result.findings if f.severity == "error"]


def test_heartbeat_timeout_alone_derives_the_in_process_timeouts() -> None:
    p = _valid('[heartbeat]\ntimeout = "30s"\n')
    ip = p.restart.in_process
    assert (ip.hard_timeout, ip.soft_timeout) == (20.0, 13.333)
    assert p.heartbeat.monitor_interval == 5.0
    assert p.heartbeat.initial_timeout is None  # NVRx's own
    assert p.job.collective_timeout == 600.0
    assert set(p.derived) == {"restart.in_process.hard_timeout", "restart.in_process.soft_timeout"}


def test_a_long_heartbeat_timeout_keeps_the_plain_defaults() -> None:
    p = _valid('[heartbeat]\ntimeout = "15m"\n')
    assert (p.restart.in_process.soft_timeout, p.restart.in_process.hard_timeout) == (60.0, 90.0)
    assert p.derived == {}


def test_monitor_interval_follows_a_short_timeout() -> None:
    assert _valid('[heartbeat]\ntimeout = "10s"\n').heartbeat.monitor_interval == 2.0
    assert _valid('[heartbeat]\ninitial_timeout = "3s"\n').heartbeat.monitor_interval == 0.6


def test_monitor_interval_follows_the_shortest_section() -> None:
    p = _valid('[heartbeat.sections]\nstep = "4s"\nckpt = "auto"\n')
    assert p.heartbeat.monitor_interval == 0.8


def test_soft_timeout_alone_derives_a_longer_hard_timeout() -> None:
    p = _valid('[restart.in_process]\nsoft_timeout = "5m"\n')
    assert p.restart.in_process.hard_timeout == 450.0
    assert p.job.collective_timeout == 900.0  # NCCL: longer than the hard timeout


def test_soft_timeout_and_heartbeat_timeout_put_the_hard_timeout_between() -> None:
    p = _valid('[heartbeat]\ntimeout = "2m"\n[restart.in_process]\nsoft_timeout = "100s"\n')
    assert p.restart.in_process.hard_timeout == 110.0


def test_hard_timeout_alone_derives_the_soft_timeout() -> None:
    assert _valid('[restart.in_process]\nhard_timeout = "30s"\n').restart.in_process.soft_timeout == 20.0


def test_gloo_derives_a_collective_timeout_below_the_soft_timeout() -> None:
    p = _valid("", job=JOB + 'backend = "gloo"\nnproc_per_node = 2\n')
    assert p.job.collective_timeout == 45.0
    cpu = _valid("", job=JOB + 'nproc_per_node = "cpu"\n')
    assert cpu.job.collective_timeout == 45.0


def test_gloo_collective_timeout_lifts_the_in_process_timeouts() -> None:
    p = _valid("", job=JOB + 'backend = "gloo"\nnproc_per_node = 2\ncollective_timeout = "2m"\n')
    ip = p.restart.in_process
    assert ip.soft_timeout > 120.0 and ip.hard_timeout > ip.soft_timeout


def test_nccl_collective_timeout_lowers_the_hard_timeout() -> None:
    p = _valid("", job=JOB + 'collective_timeout = "1m"\n')
    assert p.restart.in_process.hard_timeout == 40.0


def test_in_process_off_keeps_the_collective_default() -> None:
    p = _valid("[restart.in_process]\nenabled = false\n", job=JOB + 'backend = "gloo"\n')
    assert p.job.collective_timeout == 600.0


def test_ports_never_clash() -> None:
    assert _valid("[rendezvous]\nport = 9464\n[metrics]\nenabled = true\n").metrics.port == 9465
    assert _valid("[metrics]\nenabled = true\nport = 29500\n").rendezvous.port == 29501


def test_nodes_interval_and_escalation_follow_what_is_set() -> None:
    assert _valid("[rendezvous]\nmin_nodes = 3\n").rendezvous.nodes == 3
    assert _valid("", job=JOB + "max_steps = 50\n").checkpoint.interval == 5
    # a tenth of the run, at most 1000: no jump from 99 to 1000 steps at 1000 steps
    intervals = {
        steps: _valid("", job=JOB + f"max_steps = {steps}\n").checkpoint.interval
        for steps in (5, 990, 1000, 2000, 9999, 10_000, 50_000)
    }
    assert intervals == {5: 1, 990: 99, 1000: 100, 2000: 200, 9999: 999, 10_000: 1000, 50_000: 1000}
    assert (
        _valid("", job=JOB + "max_steps = 2000\n[checkpoint]\ninterval = 1000\n").checkpoint.interval == 1000
    )
    p = _valid("[restart.in_process]\nenabled = false\n[restart.in_job]\nmax_restarts = 1\n")
    assert p.restart.escalate_after == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[heartbeat]\ntimeout = "30s"\n[restart.in_process]\nhard_timeout = "90s"\n',
            ("timeout-order", "[restart.in_process] hard_timeout"),
        ),
        (
            '[restart.in_process]\nsoft_timeout = "2m"\nhard_timeout = "1m"\n',
            ("timeout-order", "[restart.in_process] soft_timeout"),
        ),
        (
            '[heartbeat]\ntimeout = "10s"\nmonitor_interval = "10s"\n',
            ("heartbeat-interval", "[heartbeat] monitor_interval"),
        ),
        (
            "[rendezvous]\nport = 9464\n[metrics]\nenabled = true\nport = 9464\n",
            ("port-clash", "[metrics] port"),
        ),
        ("[rendezvous]\nnodes = 1\nmin_nodes = 2\n", ("min-nodes", "[rendezvous] min_nodes")),
    ],
)
def test_explicit_contradictions_are_still_reported(text: str, expected: tuple[str, str]) -> None:
    assert expected in _codes(JOB + text)


def test_an_impossible_derivation_names_the_derived_key() -> None:
    result = validate_source(
        JOB + '[heartbeat]\ntimeout = "30s"\n[restart.in_process]\nsoft_timeout = "1m"\n', "p.toml", nvrx=NVRX
    )
    (finding,) = [f for f in result.findings if f.severity == "error"]
    assert finding.where == "[restart.in_process] hard_timeout"
    assert (
        "the policy does not set it: its default follows soft_timeout and [heartbeat] timeout" in finding.rule
    )


def test_json_round_trip_keeps_the_derived_values() -> None:
    p = _valid('[heartbeat]\ntimeout = "30s"\n')
    again = Policy.model_validate_json(p.model_dump_json())
    assert again == p and again.derived == {}


def test_unset_heartbeat_timeouts_apply_no_rule() -> None:
    # Long in-process timeouts with NVRx's own heartbeat timeouts: nothing to compare with.
    _valid(
        '[heartbeat]\nmonitor_interval = "1m"\n'
        '[restart.in_process]\nsoft_timeout = "1h"\nhard_timeout = "2h"\n'
    )


@pytest.mark.parametrize("name", ["", "a:b", "a,b", "my step", "tab\there"])
def test_bad_section_names(name: str) -> None:
    key = f'"{name}"'.replace("\t", "\\t")
    result = validate_source(JOB + f'[heartbeat.sections]\n{key} = "30s"\n', "p.toml", nvrx=NVRX)
    (finding,) = [f for f in result.findings if f.severity == "error"]
    assert (finding.code, finding.table, finding.key, finding.value) == (
        "heartbeat-section",
        "heartbeat.sections",
        name,
        '"30s"',
    )
    assert finding.line in (4, 5) and "start_section" in finding.fix  # the key, or its table


def test_section_shorter_than_the_monitor_interval_warns() -> None:
    text = JOB + '[heartbeat]\nmonitor_interval = "5s"\n[heartbeat.sections]\nstep = "2s"\nckpt = "auto"\n'
    result = validate_source(text, "p.toml", nvrx=NVRX)
    assert [(f.severity, f.code, f.where) for f in result.findings if f.severity != "info"] == [
        ("warning", "heartbeat-interval", "[heartbeat.sections] step")
    ]


def test_missing_job_table_hides_no_other_problem(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        '[restart.in_process]\nsoft_timeout = "2m"\nhard_timeout = "1m"\n[checkpoint]\ndir = "rel"\n'
    )
    run = subprocess.run(
        [str(Path(sys.executable).parent / "nvtrain"), "validate", str(path), "--nvrx", "0.7.0", "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    import json

    found = {(f["code"], f["where"]) for f in json.loads(run.stdout)["findings"]}
    assert {
        ("missing", "(top level) job"),
        ("timeout-order", "[restart.in_process] soft_timeout"),
        ("checkpoint-dir", "[checkpoint] dir"),
    } <= found
    assert not any(where.startswith("[job]") for _, where in found)

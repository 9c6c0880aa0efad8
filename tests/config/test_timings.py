"""Timings files (TOML and JSON) and the rules ``validate --timings`` checks against them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvtrain.config import Validation, validate_source
from nvtrain.nvrx import NvrxVersion
from nvtrain.tuning import Measure, Timings, read_timings
from nvtrain.tuning.sources import read_timings_or_log

NVRX = NvrxVersion.parse("0.4.1")


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_toml_shorthand_and_tables(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.toml",
        'step = "1.2s"\nrestore = 30\n[save_block]\nmedian = "800ms"\nmax = "1.5s"\n'
        '[save_write]\nmedian = "40s"\np95 = "50s"\n',
    )
    parsed = read_timings(path)
    assert parsed.findings == []
    assert parsed.model == Timings(
        step=Measure(median=1.2),
        restore=Measure(median=30.0),
        save_block=Measure(median=0.8, max=1.5),
        save_write=Measure(median=40.0, p95=50.0),
    )


def test_json(tmp_path: Path) -> None:
    data = {"step": {"median": "10s", "p95": "12s", "max": 20}, "restore": "2m", "eval": None}
    parsed = read_timings(write(tmp_path, "t.json", json.dumps(data)))
    assert parsed.findings == []
    assert parsed.model == Timings(
        step=Measure(median=10.0, p95=12.0, max=20.0), restore=Measure(median=120.0)
    )


@pytest.mark.parametrize(
    ("measure", "worst"),
    [
        (Measure(median=1.0), 1.0),
        (Measure(median=1.0, p95=2.0), 2.0),
        (Measure(median=1.0, max=3.0), 3.0),
        (Measure(median=1.0, p95=2.0, max=3.0), 3.0),
        (Measure.model_validate("5s"), 5.0),
    ],
)
def test_worst(measure: Measure, worst: float) -> None:
    assert measure.worst == worst


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        (
            "syntax.toml",
            'step = "1s\n',
            [("error", "toml-syntax", "(top level)", 1, "TOML syntax error: illegal character '\\n'")],
        ),
        (
            "bad.toml",
            'step = "x"\nbogus = 1\n[restore]\np95 = "1s"\n',
            [
                ("error", "value_error", "(top level) step", 1, "is not a duration"),
                ("error", "extra_forbidden", "(top level) bogus", 2, "unknown key"),
                ("error", "missing", "[restore] median", 3, "is required"),
            ],
        ),
        (
            "types.toml",
            "step = true\nrestore = [1]\n",
            [
                ("error", "value_error", "(top level) step", 1, "is not a duration"),
                ("error", "value_error", "(top level) restore", 2, "is not a duration"),
            ],
        ),
        (
            "latin1.toml",
            b'step = "1\xb5s"\n',
            [("error", "not-utf8", "(top level)", 1, "is not UTF-8 text (byte 9 is 0xb5)")],
        ),
        (
            "syntax.json",
            '{\n  "step": \n',
            [
                (
                    "error",
                    "json-syntax",
                    "(top level)",
                    3,
                    "is not valid JSON (Expecting value: line 3 column 1 (char 13))",
                )
            ],
        ),
        ("list.json", "[1, 2]", [("error", "json-syntax", "(top level)", None, "must be a JSON object")]),
        ("latin1.json", b'{"step": "1\xb5s"}', [("error", "json-syntax", "(top level)", None, None)]),
        (
            "bad.json",
            '{"step": false, "save_write": {"median": "1s", "mean": "1s"}}',
            [
                ("error", "value_error", "(top level) step", None, "is not a duration"),
                ("error", "extra_forbidden", "[save_write] mean", None, "unknown key"),
            ],
        ),
    ],
)
def test_bad_files_give_findings(
    tmp_path: Path, name: str, content: str | bytes, expected: list[tuple[object, ...]]
) -> None:
    path = write(tmp_path, name, content)
    parsed = read_timings(path)
    assert parsed.model is None
    ignore_rule = expected[0][-1] is None  # the rule quotes the decoder's message
    actual = [(f.severity, f.code, f.where, f.line, None if ignore_rule else f.rule) for f in parsed.findings]
    assert actual == expected
    assert {f.file for f in parsed.findings} == {str(path)}


def test_missing_file(tmp_path: Path) -> None:
    parsed = read_timings(tmp_path / "nope.toml")
    assert parsed.model is None
    (finding,) = parsed.findings
    assert (finding.code, finding.rule, finding.file) == (
        "unreadable",
        "file not found",
        str(tmp_path / "nope.toml"),
    )


def test_missing_file_fix_is_about_a_timings_file(tmp_path: Path) -> None:
    (finding,) = read_timings(tmp_path / "timings.json").findings
    # Today: "check the path, or run `nvtrain init` to write a starter policy" -- but this is a
    # timings file, not a policy, and there is no `nvtrain init` command.
    assert "policy" not in finding.fix
    assert "nvtrain init" not in finding.fix


# ---------------------------------------------------------------------------------------------
# validate --timings

POLICY = """\
[job]
name = "timed"
script = "train.py"
collective_timeout = "10m"
stop_timeout = "{stop}"

[heartbeat]
initial_timeout = "{initial}"
timeout = "{timeout}"

[restart.in_process]
enabled = {in_process}
soft_timeout = "{soft}"
hard_timeout = "{hard}"

[checkpoint]
async = {async_}
interval = {interval}
"""


def check(
    tmp_path: Path,
    timings: str,
    *,
    initial: str = "20m",
    timeout: str = "5m",
    soft: str = "1m",
    hard: str = "2m",
    in_process: str = "true",
    async_: str = "true",
    interval: int = 100,
    stop: str = "1h",
) -> list[tuple[object, ...]]:
    path = write(tmp_path, "timings.toml", timings)
    text = POLICY.format(
        initial=initial,
        timeout=timeout,
        soft=soft,
        hard=hard,
        in_process=in_process,
        async_=async_,
        interval=interval,
        stop=stop,
    )
    result = validate_with(text, path)
    return [(f.severity, f.code, f.where, f.line, f.value, f.rule, f.fix) for f in result.findings]


def test_comfortable_timings_give_no_findings(tmp_path: Path) -> None:
    assert check(tmp_path, 'step = "1s"\nrestore = "1m"\nsave_write = "10s"\n') == []


def test_heartbeat_timeout_not_longer_than_the_longest_step_is_an_error(tmp_path: Path) -> None:
    assert check(tmp_path, 'step = { median = "1m", max = "5m" }\n', soft="5m", hard="6m", timeout="7m") == [
        (
            "warning",
            "timeout-margin",
            "[heartbeat] timeout",
            9,
            '"7m"',
            "leaves less than 1.5x margin over the longest measured step (5m)",
            'raise it to at least "7m30s"',
        ),
        (
            "error",
            "timeout-measured",
            "[restart.in_process] soft_timeout",
            13,
            '"5m"',
            "is not longer than the longest measured step (5m): healthy workers would be taken for hung",
            'raise it to at least "7m30s"',
        ),
    ]
    errors = check(tmp_path, 'step = "5m"\n')
    assert [e[:4] for e in errors] == [
        ("error", "timeout-measured", "[heartbeat] timeout", 9),
        ("error", "timeout-measured", "[restart.in_process] soft_timeout", 13),
    ]


def test_timeout_below_one_and_a_half_times_the_step_is_a_warning(tmp_path: Path) -> None:
    assert check(tmp_path, 'step = { median = "10s", p95 = "50s" }\n') == [
        (
            "warning",
            "timeout-margin",
            "[restart.in_process] soft_timeout",
            13,
            '"1m"',
            "leaves less than 1.5x margin over the longest measured step (50s)",
            'raise it to at least "1m15s"',
        ),
    ]
    # exactly 1.5x is enough
    assert check(tmp_path, 'step = "40s"\n') == []


def test_an_evaluation_between_steps_is_part_of_the_longest_gap(tmp_path: Path) -> None:
    """A median step then the longest evaluation pass, with no heartbeat in between, is a gap
    that both the heartbeat timeout and the soft timeout must outlast."""
    timings = 'step = { median = "10s", max = "20s" }\neval = { median = "30s", max = "50s" }\n'
    assert check(tmp_path, timings) == [
        (
            "error",
            "timeout-measured",
            "[restart.in_process] soft_timeout",
            13,
            '"1m"',
            "is not longer than the longest measured step plus evaluation (1m: median step 10s + "
            "longest eval 50s): healthy workers would be taken for hung",
            'raise it to at least "1m30s"',
        ),
    ]
    assert check(tmp_path, timings, timeout="80s", in_process="false") == [
        (
            "warning",
            "timeout-margin",
            "[heartbeat] timeout",
            9,
            '"80s"',
            "leaves less than 1.5x margin over the longest measured step plus evaluation (1m: median "
            "step 10s + longest eval 50s)",
            'raise it to at least "1m30s"',
        ),
    ]
    # Without the evaluation, the same step leaves the timeouts comfortable.
    assert check(tmp_path, 'step = { median = "10s", max = "20s" }\n') == []


def test_a_step_longer_than_step_plus_evaluation_is_named_as_the_step(tmp_path: Path) -> None:
    findings = check(tmp_path, 'step = { median = "1s", max = "50s" }\neval = "10s"\n')
    assert [(f[1], f[2], f[5]) for f in findings] == [
        (
            "timeout-margin",
            "[restart.in_process] soft_timeout",
            "leaves less than 1.5x margin over the longest measured step (50s)",
        ),
    ]


def test_an_evaluation_without_step_timings_is_checked_alone(tmp_path: Path) -> None:
    findings = check(tmp_path, 'eval = "50s"\n', in_process="false", timeout="1m")
    assert [(f[1], f[2], f[5]) for f in findings] == [
        (
            "timeout-margin",
            "[heartbeat] timeout",
            "leaves less than 1.5x margin over the longest measured evaluation (50s)",
        ),
    ]


def test_soft_timeout_is_not_checked_when_in_process_restart_is_off(tmp_path: Path) -> None:
    assert check(tmp_path, 'step = "50s"\n', in_process="false") == []


def test_initial_timeout_against_restore_and_first_step(tmp_path: Path) -> None:
    assert check(tmp_path, 'step = "10s"\nrestore = { median = "5m", max = "15m" }\n') == [
        (
            "warning",
            "timeout-margin",
            "[heartbeat] initial_timeout",
            8,
            '"20m"',
            "leaves less than 1.5x margin over the measured checkpoint load and first step (15m10s)",
            'raise it to at least "22m45s"',
        ),
    ]


def test_async_interval_shorter_than_one_write_is_a_warning(tmp_path: Path) -> None:
    assert check(tmp_path, 'step = "2s"\nsave_write = { median = "5m", max = "10m" }\n', interval=100) == [
        (
            "warning",
            "write-bound",
            "[checkpoint] interval",
            18,
            "100",
            "100 steps take about 3m20s, less than one background write (5m): each save waits for the "
            "previous write",
            "use interval >= 225, or faster storage",
        ),
    ]
    assert check(tmp_path, 'step = "2s"\nsave_write = "5m"\n', interval=150) == []
    assert check(tmp_path, 'step = "2s"\nsave_write = "5m"\n', async_="false") == []
    assert check(tmp_path, 'save_write = "5m"\n') == []


def test_stop_timeout_shorter_than_a_write_is_a_warning(tmp_path: Path) -> None:
    assert check(tmp_path, 'save_write = { median = "1m", p95 = "4m" }\n', stop="3m") == [
        (
            "warning",
            "stop-before-write",
            "[job] stop_timeout",
            5,
            '"3m"',
            "is shorter than the longest measured checkpoint write (4m): a pod stopped during a save is "
            "killed before the checkpoint is committed (the manifests derive "
            "terminationGracePeriodSeconds from this value)",
            'raise it to at least "6m"',
        ),
    ]
    assert check(tmp_path, 'save_write = { median = "1m", p95 = "4m" }\n', stop="4m") == []


def test_findings_of_the_timings_file_come_with_its_name(tmp_path: Path) -> None:
    path = write(tmp_path, "timings.toml", 'step = "fast"\n')
    result = validate_with(
        POLICY.format(
            initial="20m",
            timeout="5m",
            soft="1m",
            hard="2m",
            in_process="true",
            async_="true",
            interval=100,
            stop="1h",
        ),
        path,
    )
    assert [(f.file, f.line, f.where, f.rule) for f in result.findings] == [
        (str(path), 1, "(top level) step", "is not a duration")
    ]
    assert result.policy is not None
    assert not result.ok


# ---------------------------------------------------------------------------------------------
# validate --timings with a run's events log

DEMO_LOG = Path(__file__).resolve().parents[1] / "tuning" / "data" / "cpu-demo-events.jsonl"


def events_log(path: Path, step_times: list[float]) -> Path:
    """An events log with one `step` event per time (what the worker library writes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"ts": 1000.0 + i, "event": "step", "step": i + 1, "step_s": s, "pid": 7, "rank": 0})
        for i, s in enumerate(step_times)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def validate_with(text: str, timings_path: Path) -> Validation:
    """``validate --timings``: the timings read as the CLI reads them, then the policy checked."""
    timings, problems = read_timings_or_log(timings_path)
    return validate_source(text, "p.toml", nvrx=NVRX, timings=timings, timings_findings=problems)


def findings_with(timings_path: Path, *, with_fix: bool = False, **policy: str) -> list[tuple[object, ...]]:
    values = {
        "initial": "20m",
        "timeout": "5m",
        "soft": "1m",
        "hard": "2m",
        "in_process": "true",
        "async_": "true",
        "interval": "100",
        "stop": "1h",
    }
    result = validate_with(POLICY.format(**{**values, **policy}), timings_path)
    return [
        (f.severity, f.code, f.where, f.file, f.rule, *([f.fix] if with_fix else [])) for f in result.findings
    ]


@pytest.mark.parametrize("as_directory", [True, False])
def test_timings_measured_from_an_events_log(tmp_path: Path, as_directory: bool) -> None:
    log = events_log(tmp_path / "run" / "events.jsonl", [10.0] * 19 + [50.0])
    # the run directory, or the log itself
    assert findings_with(log.parent if as_directory else log) == [
        (
            "warning",
            "timeout-margin",
            "[restart.in_process] soft_timeout",
            "p.toml",
            "leaves less than 1.5x margin over the longest measured step (50s)",
        ),
    ]


def test_timings_from_the_demo_runs_events_log(tmp_path: Path) -> None:
    run = tmp_path / "demo3"
    run.mkdir()
    (run / "events.jsonl").write_bytes(DEMO_LOG.read_bytes())
    # Its steps take ~0.1 s, its restore ~1 s, its writes ~0.15 s: all comfortable here ...
    assert findings_with(run) == []
    # ... and a heartbeat timeout under 1.5x its longest step (0.133 s) is not.
    findings = findings_with(DEMO_LOG, timeout="150ms", soft="50ms", hard="100ms", initial="1h")
    assert [f for f in findings if f[1].startswith("timeout")] == [
        (
            "warning",
            "timeout-margin",
            "[heartbeat] timeout",
            "p.toml",
            "leaves less than 1.5x margin over the longest measured step (133.216ms)",
        ),
        (
            "error",
            "timeout-measured",
            "[restart.in_process] soft_timeout",
            "p.toml",
            "is not longer than the longest measured step (133.216ms): healthy workers would be "
            "taken for hung",
        ),
    ]


def test_events_logs_that_cannot_be_used(tmp_path: Path) -> None:
    fix = "give a run directory (<checkpoint dir>/<run id>) or one of the events-node<N>.jsonl files in it"
    empty_dir = tmp_path / "empty-run"
    empty_dir.mkdir()
    missing = tmp_path / "missing.jsonl"
    blank = write(tmp_path, "blank.jsonl", "not json\n")
    skipped = (
        "holds no events with a time stamp and a name (1 line skipped: an event is a JSON object with a "
        "finite number `ts`, a string `event` and numbers in its numeric fields)"
    )
    for path, rule, how in (
        (empty_dir, "has no events log (events-node<N>.jsonl)", fix),
        (missing, "does not exist", fix),
        (blank, skipped, "give the run directory that `nvtrain run` wrote (<checkpoint dir>/<run id>)"),
    ):
        assert findings_with(path, with_fix=True) == [
            ("error", "unreadable", "(top level)", str(path), rule, how)
        ]
    no_steps = write(tmp_path, "nosteps.jsonl", json.dumps({"ts": 1.0, "event": "launcher_start"}) + "\n")
    assert findings_with(no_steps, with_fix=True) == [
        (
            "warning",
            "timings-no-steps",
            "(top level)",
            str(no_steps),
            "has no step timings (`step` events with a `step_s`), so the heartbeat and soft timeouts were "
            "not checked against it",
            "give the events log of a run that completed steps, or a timings file with `step`",
        )
    ]

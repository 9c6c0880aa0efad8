"""Reliability review: policy values that passed ``validate`` but could not work, and policy files
that made the reader hang, read without bound or crash (deep nesting, huge numbers)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import nvtrain.config.load
from nvtrain.config import validate_file, validate_source
from nvtrain.config.timings import read_timings
from nvtrain.config.validation import Validation
from nvtrain.findings import Finding, toml_value
from nvtrain.launcher.identity import Identity
from nvtrain.launcher.plan import build_plan
from nvtrain.nvrx import NvrxVersion

NVRX = NvrxVersion.parse("0.4.1")
JOB = '[job]\nname = "job-1"\n'


def check(text: str) -> Validation:
    return validate_source(text, "p.toml", nvrx=NVRX)


def errors(result: Validation) -> list[tuple[str, str, str | None]]:
    return [(f.code, f.where, f.value) for f in result.errors]


def only_error(result: Validation) -> Finding:
    assert result.policy is not None
    (finding,) = result.errors
    assert finding.file == "p.toml" and finding.line is not None and finding.fix
    return finding


# -- 1. strings that become command-line words or paths -------------------------------------


def test_a_script_that_looks_like_an_option_is_refused() -> None:
    finding = only_error(check(JOB + 'script = "--max-restarts=0"\n'))
    assert (finding.code, finding.where, finding.value) == (
        "job-entrypoint",
        "[job] script",
        '"--max-restarts=0"',
    )
    assert "starts with '-'" in finding.rule and "ft_launcher" in finding.rule
    assert finding.fix == 'write a path such as script = "./--max-restarts=0"'


def test_the_fixed_script_is_a_positional_after_the_launcher_options() -> None:
    result = check(JOB + 'script = "./--max-restarts=0"\n')
    assert result.ok and result.policy is not None
    identity = Identity(
        node_rank=0,
        standalone=True,
        address=None,
        hostname="h",
        run_id="r1",
        has_gpu=False,
        has_infiniband=False,
    )
    plan = build_plan(
        result.policy, identity, NVRX, python="python", policy_path="p.json", events_path="e.jsonl"
    )
    assert plan.argv[-1] == "./--max-restarts=0"
    assert [a for a in plan.argv if a.startswith("--max-restarts")] == ["--max-restarts=5"]


@pytest.mark.parametrize(
    ("line", "key", "rule"),
    [
        ('script = ""', "script", "must not be empty"),
        ('script = "   "', "script", "must not be empty"),
        ('script = "train\\u0000.py"', "script", "contains a NUL character"),
        ('module = "-m"', "module", "starts with '-'"),
        ('module = ""', "module", "must not be empty"),
        ('module = "pkg\\u0000"', "module", "contains a NUL character"),
    ],
)
def test_empty_nul_and_dash_entrypoints_are_refused(line: str, key: str, rule: str) -> None:
    finding = only_error(check(JOB + line + "\n"))
    assert (finding.code, finding.key) == ("job-entrypoint", key)
    assert finding.rule.startswith(rule)


def test_args_with_a_nul_are_refused_and_dashes_are_fine() -> None:
    finding = only_error(check(JOB + 'script = "t.py"\nargs = ["--lr=1", "a\\u0000b"]\n'))
    assert (finding.code, finding.where, finding.value) == ("job-args", "[job] args", '"a\\u0000b"')
    assert finding.rule.startswith("element 2 contains a NUL character")
    assert check(JOB + 'script = "t.py"\nargs = ["--max-restarts=0", "-x"]\n').ok


@pytest.mark.parametrize(
    ("value", "rule"),
    [('""', "must be an absolute path"), ('"/ckpt\\u0000x"', "contains a NUL character")],
)
def test_checkpoint_dir_empty_or_with_nul_is_refused(value: str, rule: str) -> None:
    finding = only_error(check(JOB + f'script = "t.py"\n[checkpoint]\ndir = {value}\n'))
    assert (finding.code, finding.where) == ("checkpoint-dir", "[checkpoint] dir")
    assert finding.rule.startswith(rule)


# -- 2. absurd sizes ------------------------------------------------------------------------


def test_nproc_per_node_has_an_upper_bound() -> None:
    base = JOB + 'script = "t.py"\n'
    finding = only_error(check(base + f"nproc_per_node = {2**63 - 1}\n"))
    assert (finding.code, finding.where, finding.value) == (
        "size-limit",
        "[job] nproc_per_node",
        "9223372036854775807",
    )
    assert finding.rule.startswith("must be <= 1024")
    assert check(base + "nproc_per_node = 1024\n").ok


def test_nodes_has_kubernetes_indexed_job_limit() -> None:
    base = JOB + 'script = "t.py"\n[rendezvous]\n'
    result = check(base + f"nodes = {2**63 - 1}\n")
    assert errors(result) == [("size-limit", "[rendezvous] nodes", "9223372036854775807")]
    assert "100,000" in result.errors[0].rule
    assert errors(check(base + "nodes = 100001\n")) == [("size-limit", "[rendezvous] nodes", "100001")]
    assert check(base + "nodes = 100000\n").ok


@pytest.mark.parametrize(
    ("table", "line"),
    [
        ("job", "stop_timeout = 1e300"),
        ("job", 'stop_timeout = "366d"'),
        ("heartbeat", "initial_timeout = 1e12"),
        ("restart.in_process", 'failure_window = "400d"'),
    ],
)
def test_durations_longer_than_a_year_are_refused(table: str, line: str) -> None:
    text = JOB + 'script = "t.py"\n' + ("" if table == "job" else f"[{table}]\n") + line + "\n"
    findings = [f for f in check(text).errors if f.code == "duration-limit"]
    assert [f.where for f in findings] == [f"[{table}] {line.split(' ')[0]}"]
    assert findings[0].rule.startswith("is longer than 365d (a year)")
    assert findings[0].fix.startswith('use at most "365d"')
    assert len(findings[0].value or "") <= 80


def test_a_year_is_still_a_duration() -> None:
    assert check(JOB + 'script = "t.py"\nstop_timeout = "365d"\n').ok


# -- 5. nesting and numbers that crash the readers -----------------------------------------


def test_deeply_nested_toml_is_a_finding_not_a_recursion_error() -> None:
    text = JOB + 'script = "t.py"\nargs = ' + "[" * 100_000 + "]" * 100_000 + "\n"
    result = check(text)
    assert result.policy is None
    assert [(f.code, f.file) for f in result.findings] == [("too-nested", "p.toml")]
    assert "nested too deeply" in result.findings[0].rule


@pytest.mark.parametrize("depth", [300, 400, 900])
def test_moderately_nested_values_are_type_errors(depth: str) -> None:
    """Nesting that tomllib parses but that the rest of the pipeline once recursed on."""
    text = JOB + 'script = "t.py"\nargs = ' + "[" * int(depth) + "]" * int(depth) + "\n"
    result = check(text)
    assert result.policy is None
    assert result.errors
    assert all(len(f.value or "") <= 80 for f in result.findings)
    unknown = check(JOB + 'script = "t.py"\nextra = ' + "[" * int(depth) + "]" * int(depth) + "\n")
    assert [f.code for f in unknown.errors] in (["extra_forbidden"], ["too-nested"])


def test_an_integer_beyond_python_digit_limit_is_a_syntax_finding() -> None:
    result = check(JOB + 'script = "t.py"\nmax_steps = ' + "1" * 5000 + "\n")
    assert [f.code for f in result.findings] == ["toml-syntax"]
    assert "4300 digits" in result.findings[0].rule


def test_deeply_nested_json_timings_are_a_finding(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"step": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    parsed = read_timings(path)
    assert parsed.model is None
    assert [(f.code, f.file) for f in parsed.findings] == [("too-nested", str(path))]


def test_toml_value_of_a_huge_or_deep_value_is_bounded() -> None:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    started = time.monotonic()
    assert toml_value(deep) == "[" * 77 + "..."
    assert toml_value(["x" * 10_000_000]) == '["' + "x" * 75 + "..."
    assert time.monotonic() - started < 1.0
    assert toml_value([1, "a", {"k": [True, 2.5]}]) == '[1, "a", {k = [true, 2.5]}]'


# -- 6. what is read, and how much ----------------------------------------------------------


@contextlib.contextmanager
def fifo_at(path: Path) -> Iterator[Path]:
    """A FIFO at ``path``. Should a reader block on it for 5 s, a policy is written into it, so
    that a regression fails the test instead of hanging it."""
    os.mkfifo(path)
    done = threading.Event()

    def rescue() -> None:
        if not done.wait(5.0):
            with path.open("w", encoding="utf-8") as writer:
                writer.write(JOB + 'script = "t.py"\n')

    thread = threading.Thread(target=rescue, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        done.set()
        thread.join()


def test_a_fifo_is_refused_without_being_opened(tmp_path: Path) -> None:
    with fifo_at(tmp_path / "policy.toml") as fifo:
        started = time.monotonic()
        result = validate_file(fifo, nvrx=NVRX)  # blocked in open() before the fix
    assert [(f.code, f.rule) for f in result.findings] == [
        ("unreadable", "is not a regular file (it is a FIFO)")
    ]
    assert time.monotonic() - started < 4.0


def test_a_file_larger_than_the_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    with path.open("wb") as f:
        f.truncate(nvtrain.config.load.MAX_FILE_BYTES + 1)  # sparse: nothing to read
    (finding,) = validate_file(path, nvrx=NVRX).findings
    assert (finding.code, finding.file) == ("too-large", str(path))
    assert finding.rule == f"is larger than 4 MiB ({nvtrain.config.load.MAX_FILE_BYTES + 1} bytes)"


def test_reading_stops_at_the_limit_when_the_size_is_not_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files in /proc are regular and report size 0; the read itself is capped."""
    monkeypatch.setattr(nvtrain.config.load, "MAX_FILE_BYTES", 16)
    (finding,) = validate_file(Path("/proc/self/status"), nvrx=NVRX).findings
    assert finding.code == "too-large"


def test_a_file_at_the_limit_is_read(tmp_path: Path) -> None:
    text = JOB + 'script = "t.py"\n'
    path = tmp_path / "p.toml"
    path.write_text(text + "#" * (nvtrain.config.load.MAX_FILE_BYTES - len(text) - 1) + "\n")
    assert path.stat().st_size == nvtrain.config.load.MAX_FILE_BYTES
    assert validate_file(path, nvrx=NVRX).ok


def test_findings_of_new_rules_serialise() -> None:
    result = check(JOB + 'script = "-x"\nnproc_per_node = 5000\nstop_timeout = 1e300\n')
    assert sorted(f.code for f in result.errors) == ["duration-limit", "job-entrypoint", "size-limit"]
    json.dumps([f.to_dict() for f in result.findings])

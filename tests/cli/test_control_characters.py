"""Text from outside (an events log's fields: a run id, a fault's kind, a worker's error, a host
name; a path; a policy's value) reaches the terminal with its control characters written out
(``render.console.visible``): no escape sequence in it can retitle or clear the terminal."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from nvtrain.cli import app
from nvtrain.cli.render import events
from nvtrain.cli.render.console import visible
from nvtrain.events.records import Event, from_fields

ROOT = Path(__file__).resolve().parents[2]
CPU_LOG = ROOT / "tests/tuning/data/cpu-demo-events.jsonl"
TITLE = "\x1b]0;pwned\x07"  # OSC 0: set the window title
CLEAR = "\x1b[2J"  # CSI 2 J: clear the screen
C1 = "\x9b2J\x85"  # 8-bit CSI, NEL

runner = CliRunner()


def invoke(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def assert_no_controls(text: str) -> None:
    controls = sorted(
        {hex(ord(c)) for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F}
    )
    assert controls == [], text


def hostile_log(path: Path) -> Path:
    """The CPU demo's log, its run id a terminal title, its injected faults' kind a screen
    clear, its host names 8-bit controls."""
    lines = []
    for line in CPU_LOG.read_text(encoding="utf-8").splitlines():
        fields = json.loads(line)
        fields["run_id"] = f"demo{TITLE}3"
        fields["host"] = f"vm{C1}"
        if fields["event"] == "fault_injected":
            fields["kind"] = f"{CLEAR}{fields['kind']}"
        lines.append(json.dumps(fields))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_report_prints_an_events_logs_escape_sequences_made_visible(tmp_path: Path) -> None:
    log = hostile_log(tmp_path / "events-node0.jsonl")
    result = invoke("report", str(log), "--no-timeline")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout + result.stderr
    assert_no_controls(result.stdout + result.stderr)
    assert "run demo\\x1b]0;pwned\\x073:" in result.stdout  # the run id, made visible
    assert "\\x1b[2Jexception (injected)" in result.stdout  # the incident's cause
    as_json = invoke("report", str(log), "--no-timeline", "--json")
    assert "\x1b" not in as_json.stdout and json.loads(as_json.stdout)["run_id"] == f"demo{TITLE}3"


def test_tune_interval_and_errors_show_a_paths_controls_made_visible(tmp_path: Path) -> None:
    folder = tmp_path / f"run{CLEAR}{TITLE}"
    folder.mkdir()
    hostile_log(folder / "events-node0.jsonl")
    tuned = invoke("tune-interval", "--from-run", str(folder), "--mtbf", "6h")
    assert tuned.exit_code == 0, tuned.output
    assert "\x1b" not in tuned.stdout + tuned.stderr
    missing = invoke("report", str(folder / f"x{CLEAR}"))
    assert missing.exit_code == 2
    assert "\x1b" not in missing.stderr and "x\\x1b[2J does not exist" in missing.stderr


def test_a_policys_value_is_shown_with_its_controls_made_visible(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    # TOML escapes: ESC and BEL (which the value's JSON form escapes too), 8-bit CSI (which it does not)
    policy.write_text(
        '[job]\nname = "\\u001b]0;pwned\\u0007\\u009b2J"\nscript = "train.py"\n', encoding="utf-8"
    )
    result = invoke("validate", str(policy))
    assert result.exit_code == 2, result.output
    assert_no_controls(result.stderr)
    assert 'name = "\\u001b]0;pwned\\u0007\\x9b2J"' in result.stderr


# The messages of `nvtrain run` (``event_reporter``): logfmt lines in pod logs, styled on a terminal.
WORKER_FAILED = {
    "ts": 1.0,
    "event": "worker_failed",
    "source": "launcher",
    "host": f"node{C1}",
    "rank": 1,
    "exit_code": 1,
    "raised": f"RuntimeError:{TITLE}boom{CLEAR}\nsecond-line",  # no space: logfmt does not quote it
}


@pytest.mark.parametrize(
    ("print_event", "shown"),
    [
        # in pod logs (logfmt): the value quoted as JSON, which escapes its controls
        (events._plain_event, 'raised="RuntimeError:\\u001b]0;pwned\\u0007boom\\u001b[2J\\nsecond-line"'),
        # on a terminal: the value with its controls written out
        (events._styled_event, "raised=RuntimeError:\\x1b]0;pwned\\x07boom\\x1b[2J\\x0asecond-line"),
    ],
    ids=["plain", "styled"],
)
def test_runs_messages_show_a_workers_error_with_its_controls_made_visible(
    print_event: Callable[[Event], None], shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    record = from_fields(WORKER_FAILED)
    assert record is not None
    print_event(record)
    printed = capsys.readouterr().err
    assert "\x1b" not in printed and printed.count("\n") == 1  # one line: its newline is escaped
    assert_no_controls(printed)
    assert shown in printed


def test_visible() -> None:
    assert visible(f"a{TITLE}\tb\n{C1}\x7f") == "a\\x1b]0;pwned\\x07\tb\n\\x9b2J\\x85\\x7f"
    assert visible("a\tb\nc\r", lines=False) == "a\\x09b\\x0ac\\x0d"
    assert visible("plain text: é, ü, 日本, →") == "plain text: é, ü, 日本, →"


class _Writes:
    """A stream that keeps each ``write`` call apart."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_an_event_line_is_one_write_with_its_newline(monkeypatch: pytest.MonkeyPatch) -> None:
    # The workers' lines share the stream: a newline written apart (``print`` under
    # PYTHONUNBUFFERED) let a worker's line land in the middle of an event line.
    stream = _Writes()
    monkeypatch.setattr("sys.stderr", stream)
    record = from_fields(WORKER_FAILED)
    assert record is not None
    events._plain_event(record)
    assert len(stream.calls) == 1 and stream.calls[0].endswith("\n"), stream.calls
    assert stream.calls[0].startswith("nvtrain: ") and stream.calls[0].count("\n") == 1

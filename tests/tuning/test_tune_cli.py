"""``nvtrain tune-interval`` through typer's CliRunner, and what it imports."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from nvtrain.cli import app

DATA = Path(__file__).resolve().parent / "data"
CPU_LOG = DATA / "cpu-demo-events.jsonl"
BY_HAND = [
    "--step-time",
    "4s",
    "--save-block",
    "0.8s",
    "--save-write",
    "2m",
    "--restart",
    "3m",
    "--restore",
    "90s",
]
POLICY = """\
[job]
name = "llm"
script = "train.py"
nproc_per_node = 8   # one rank per GPU

[rendezvous]
nodes = 128

# saves
[checkpoint]
dir = "/checkpoints"
interval = 100   # steps
"""

runner = CliRunner()


def tune(*args: str) -> Result:
    result = runner.invoke(app, ["tune-interval", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


def unspaced(text: str) -> str:
    return "".join(text.split())


def write(tmp_path: Path, text: str = POLICY, name: str = "policy.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_by_hand(tmp_path: Path) -> None:
    result = tune(*BY_HAND, "--gpu-mtbf", "8000h", "--policy", str(write(tmp_path)))
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    out = result.stdout
    assert "from 1,024 GPUs x 8000h each" in out  # 128 nodes x 8 ranks from the policy
    assert "job MTBF" in out and "7h49m" in out
    assert "Young" in out and "Daly" in out
    for row in ("recommended  async", "recommended  sync", "current      async", "current      sync"):
        assert row in out
    assert "instead of every 100 steps" in out


def test_json_for_scripts(tmp_path: Path) -> None:
    result = tune(*BY_HAND, "--mtbf", "7.9h", "--policy", str(write(tmp_path)), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["mode"] == "async"
    assert data["interval_steps"] == data["recommended"]["async"]["interval_steps"]
    assert data["binds"] == "failures"
    assert data["inputs"]["mtbf_s"] == pytest.approx(7.9 * 3600)
    assert data["inputs"]["from"]["step"] == "given (--step-time)"
    assert data["current"]["interval_steps"] == 100
    for outcome in (data["recommended"]["async"], data["current"]["sync"]):
        assert 0 <= outcome["efficiency"] <= 1
        assert set(outcome["waste"]) == {"saving", "rework", "recovery"}
    assert data["recommended"]["async"]["efficiency"] >= data["current"]["async"]["efficiency"]
    assert data["advice"] and data["applied"] is None and data["measured"] is None


def test_the_published_8_node_case() -> None:
    result = tune(
        "--step-time", "2.8s", "--save-block", "0.78s", "--save-write", "275s", "--mtbf", "7.9h", "--json"
    )
    data = json.loads(result.stdout)
    assert data["binds"] == "write"
    assert data["interval_steps"] >= 148
    assert data["advice"].startswith("Storage-bound")


def test_from_run_on_a_cpu_demo_log() -> None:
    result = tune("--from-run", str(CPU_LOG), "--mtbf", "1h")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "measured: median of" in out
    assert "in-job" in out  # the demo's SIGKILL fault was recovered by an in-job restart
    assert "recommended  async" in out and "current" not in out


def test_from_run_with_a_run_directory_and_apply(tmp_path: Path) -> None:
    run = tmp_path / "ckpt" / "run-1"
    run.mkdir(parents=True)
    shutil.copy(CPU_LOG, run / "events.jsonl")
    policy = write(tmp_path)
    result = tune(
        "--from-run", str(run), "--gpus", "2", "--gpu-mtbf", "100h", "--apply", str(policy), "--json"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    new = data["interval_steps"]
    assert data["events"] == str(run / "events.jsonl")
    assert data["applied"]["old"] == 100 and data["applied"]["new"] == new and data["applied"]["changed"]
    assert policy.read_text(encoding="utf-8") == POLICY.replace("interval = 100 ", f"interval = {new} ")
    assert data["measured"]["counts"]["restart_in_job"] == 1


def test_apply_prints_what_changed(tmp_path: Path) -> None:
    policy = write(tmp_path)
    result = tune(*BY_HAND, "--mtbf", "7.9h", "--apply", str(policy))
    assert result.exit_code == 0, result.output
    # Compared without white space: a long tmp_path (pytest-xdist adds popen-gwN) is wrapped.
    assert unspaced(f"applied: {policy}:12: [checkpoint] interval 100 ->") in unspaced(result.stdout)


def test_a_sync_policy_needs_no_write_time(tmp_path: Path) -> None:
    policy = write(tmp_path, POLICY.replace("interval = 100", "interval = 100\nasync = false"))
    result = tune(
        "--step-time", "4s", "--save-block", "2m", "--mtbf", "8h", "--policy", str(policy), "--json"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["mode"] == "sync" and list(data["recommended"]) == ["sync"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*BY_HAND[:3], "-1s", *BY_HAND[4:], "--mtbf", "1h"], "--save-block -1s is negative"),
        ([*BY_HAND, "--mtbf", "0"], "--mtbf 0 must be longer than zero"),
        ([*BY_HAND, "--mtbf", "-3h"], "--mtbf -3h is negative"),
        ([*BY_HAND, "--mtbf", "5 hours"], "--mtbf 5 hours is not a duration"),
        ([*BY_HAND, "--restart", "-5"], "--restart -5 is negative"),
        (BY_HAND, "needs the failure rate"),
        (["--mtbf", "1h"], "needs the step time, the time blocked per save and the background write time"),
        ([*BY_HAND, "--gpus", "8"], "--gpus needs --gpu-mtbf"),
        ([*BY_HAND, "--gpus", "0", "--gpu-mtbf", "1000h"], "--gpus 0 is below 1"),
        ([*BY_HAND, "--gpu-mtbf", "1000h"], "--gpu-mtbf needs --gpus"),
        ([*BY_HAND, "--mtbf", "1h", "--node-mtbf", "1000h", "--nodes", "2"], "cannot be combined"),
        ([*BY_HAND, "--mtbf", "1h", "--write-margin", "0.9"], "--write-margin 0.9 is below 1"),
        (["--from-run", "/nonexistent/run", "--mtbf", "1h"], "/nonexistent/run does not exist"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], message: str) -> None:
    result = tune(*args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("nvtrain: error:")
    assert message in " ".join(result.stderr.split())
    assert "fix:" in result.stderr


def test_a_log_without_checkpoints_names_the_file_and_what_is_missing(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    lines = [line for line in CPU_LOG.read_text().splitlines() if '"event":"checkpoint_' not in line]
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = tune("--from-run", str(tmp_path), "--mtbf", "1h")
    assert result.exit_code == 2
    text = " ".join(result.stderr.split())
    assert f"{log} has no checkpoint saves" in text and "committed checkpoints" in text
    assert "--save-block" in text
    # given by hand, what the log lacks is no longer missing
    assert (
        tune(
            "--from-run", str(tmp_path), "--mtbf", "1h", "--save-block", "1s", "--save-write", "3s"
        ).exit_code
        == 0
    )


def test_an_invalid_policy_is_reported_like_validate(tmp_path: Path) -> None:
    policy = write(tmp_path, POLICY.replace("interval = 100", "interval = 0"))
    result = tune(*BY_HAND, "--mtbf", "1h", "--policy", str(policy))
    assert result.exit_code == 2
    assert "[checkpoint] interval = 0" in result.stderr and "must be >= 1" in result.stderr


def test_help() -> None:
    result = tune("--help")
    assert result.exit_code == 0
    for option in ("--from-run", "--step-time", "--gpu-mtbf", "--node-mtbf", "--apply", "--json", "--policy"):
        assert option in result.stdout


def test_tune_interval_does_not_import_torch(tmp_path: Path) -> None:
    policy = write(tmp_path)
    code = f"""
        import json, sys
        from typer.testing import CliRunner
        from nvtrain.cli import app

        runner = CliRunner()
        codes = [
            runner.invoke(app, ["tune-interval", "--from-run", {str(CPU_LOG)!r}, "--mtbf", "2h"]).exit_code,
            runner.invoke(app, ["tune-interval", "--from-run", {str(CPU_LOG)!r}, "--mtbf", "2h", "--json",
                                "--apply", {str(policy)!r}]).exit_code,
            runner.invoke(app, ["tune-interval", "--mtbf", "0"]).exit_code,
            runner.invoke(app, ["tune-interval", "--help"]).exit_code,
        ]
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "nvidia_resiliency_ext"))
        print(json.dumps({{"codes": codes, "heavy": heavy}}))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"codes": [0, 0, 2, 0], "heavy": []}


def test_the_worked_example_in_the_docs_is_what_the_command_prints(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "tune-interval.md").read_text(encoding="utf-8")
    section = page.split("## Worked example", 1)[1]
    policy_text = section.split("```toml\n", 1)[1].split("```", 1)[0]
    shown = section.split("```text\n", 1)[1].split("```", 1)[0]
    command, _, printed = shown.partition("\nCheckpoint interval")
    args = command.replace("\\\n", " ").split()
    assert args[:3] == ["$", "nvtrain", "tune-interval"]
    (tmp_path / "llm.toml").write_text(policy_text, encoding="utf-8")
    args = [str(tmp_path / a) if a == "llm.toml" else a for a in args[3:]]
    result = tune(*args)
    assert result.exit_code == 0, result.output
    expected = ("Checkpoint interval" + printed).replace("for llm.toml", f"for {tmp_path / 'llm.toml'}")

    assert unspaced(result.stdout) == unspaced(expected)  # the console may wrap a long path

"""The integrations' checkpoint cadence on a policy without ``[checkpoint] interval``, and the
calls they refuse, for real: 2 gloo ranks under ``nvtrain run`` (``bin/``'s scripts).

- A 40-step run on the default policy commits checkpoints: the Trainer's ``save_steps``, or a
  tenth of the loop's ``max_steps``, said in one line; an exception then resumes from one of
  them, not from step 0 (before, the default interval of 1000 left the run with none).
- A refused call (``resume_from_checkpoint=``, ``ckpt_path=``) ends the run at the first
  attempt with exit 2 and the error in its cause (before: about 80 in-process retries, then
  exit 4 without the error).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from support.worker_helpers import RunResult, assert_clean_exit, demo_tables, run_nvtrain, write_policy

BIN = Path(__file__).resolve().parent / "bin"
STEPS = 40
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _tables(script: str, root: Path, args: list[str]) -> dict[str, dict[str, Any]]:
    """The fault-matrix timeouts of the framework tests, and the default cadence: neither
    ``[checkpoint] interval`` nor ``[job] max_steps`` (which the interval would be derived from)."""
    t = demo_tables(root / "ckpt", name="cadence", ranks=2, steps=STEPS)
    del t["job"]["module"], t["job"]["max_steps"], t["checkpoint"]["interval"]
    t["job"] |= {
        "script": str(BIN / script),
        "args": ["--steps", str(STEPS), "--out", str(root / "out"), *args],
    }
    t["job"]["warm_start"] = True
    t["restart.in_job"] = {"max_restarts": 3}
    return t


def _run(
    tmp_path: Path, script: str, args: tuple[str, ...] = (), faults: tuple[dict[str, Any], ...] = ()
) -> RunResult:
    t = _tables(script, tmp_path, list(args))
    policy = write_policy(tmp_path / "policy.toml", t, faults)
    return run_nvtrain(policy, "cadence", tmp_path / "ckpt", tmp_path, 240.0)


def _said(run: RunResult) -> list[tuple[str, str]]:
    """(interval, where it came from) of each cadence line (rank 0's, once)."""
    return re.findall(r"^nvtrain: rank \d+: checkpoint every (\d+) steps \((.*)\)$", run.output, re.MULTILINE)


def _committed(run: RunResult) -> list[int]:
    return sorted({e["step"] for e in run.events if e["event"] == "checkpoint_committed"})


def _restored(run: RunResult) -> list[int]:
    return [e["step"] for e in run.events if e["event"] == "checkpoint_restored"]


def test_hf_default_policy_takes_the_trainers_save_steps(tmp_path: Path) -> None:
    """``save_steps = 10``: nvtrain's saves every 10 steps, said once; an exception at step 25
    resumes from 20 (or 10, when the save of 20 was still in flight), not from the start."""
    fault = {"step": 25, "rank": 1, "kind": "exception"}
    run = _run(tmp_path, "hf_train.py", ("--save-steps", "10"), (fault,))
    assert_clean_exit(run)
    said = _said(run)
    assert said == [("10", "the framework's save_steps; [checkpoint] interval is unset")], run.describe()
    assert _committed(run) == [10, 20, 30, 40], _committed(run)
    assert [e["step"] for e in run.events if e["event"] == "fault_injected"] == [25], run.describe()
    assert _restored(run) and set(_restored(run)) <= {10, 20}, run.describe()


def test_hf_save_steps_past_the_end_takes_a_tenth_of_max_steps(tmp_path: Path) -> None:
    """The Trainer's default ``save_steps = 500`` never comes in 40 steps: every 4 steps."""
    run = _run(tmp_path, "hf_train.py", ("--save-steps", "500"))
    assert_clean_exit(run)
    said = _said(run)
    assert said == [
        (
            "4",
            "a tenth of max_steps = 40; the framework's save_steps = 500 does not save before the "
            "run's end; [checkpoint] interval is unset",
        )
    ], run.describe()
    assert _committed(run) == list(range(4, STEPS + 1, 4)), _committed(run)
    assert not list((tmp_path / "out").glob("checkpoint-*"))  # the Trainer's own saves replaced


def test_accelerate_default_policy_takes_a_tenth_of_max_steps(tmp_path: Path) -> None:
    run = _run(tmp_path, "accelerate_train.py")
    assert_clean_exit(run)
    said = _said(run)
    assert said == [("4", "a tenth of max_steps = 40; [checkpoint] interval is unset")], run.describe()
    assert _committed(run) == list(range(4, STEPS + 1, 4)), _committed(run)


def test_lightning_default_policy_takes_the_model_checkpoints_cadence(tmp_path: Path) -> None:
    """``ModelCheckpoint(every_n_train_steps=8)``: nvtrain's saves every 8 steps, Lightning's
    own none."""
    run = _run(tmp_path, "lightning_train.py", ("--checkpoint-every", "8"))
    assert_clean_exit(run)
    said = _said(run)
    expected = "the framework's ModelCheckpoint(every_n_train_steps); [checkpoint] interval is unset"
    assert said == [("8", expected)], run.describe()
    assert _committed(run) == list(range(8, STEPS + 1, 8)), _committed(run)
    assert not list((tmp_path / "out").rglob("*.ckpt"))


def _check_refused(run: RunResult, words: str) -> None:
    """Exit 2 at the first attempt: one worker start and one attempt per rank, no restart of
    either layer, the error in the launcher's cause."""
    assert run.code == 2, run.describe()
    events = run.events
    kinds = [e["event"] for e in events]
    assert kinds.count("worker_start") == 2, run.describe()
    assert kinds.count("attempt_start") <= 2, run.describe()
    # No in-process restart; ft_launcher may log the in-job restart it was about to begin when
    # nvtrain stopped it, but starts no worker again.
    assert not [e for e in events if e["event"] == "restart_begin" and e.get("layer") != "in_job"], kinds
    exits = [e for e in events if e["event"] == "launcher_exit"]
    assert exits and exits[-1]["exit_code"] == 2, exits
    cause = exits[-1]["cause"]
    assert cause.startswith("usage error on ") and "refused the script's call" in cause, cause
    assert words in cause and cause.endswith("not retrying: fix the script, then start again"), cause


def test_hf_resume_from_checkpoint_is_refused_at_once(tmp_path: Path) -> None:
    run = _run(tmp_path, "hf_train.py", ("--resume-from-checkpoint",))
    _check_refused(run, "drop resume_from_checkpoint")


def test_lightning_ckpt_path_is_refused_at_once(tmp_path: Path) -> None:
    run = _run(tmp_path, "lightning_train.py", ("--ckpt-path", str(tmp_path / "last.ckpt")))
    _check_refused(run, "drop ckpt_path")

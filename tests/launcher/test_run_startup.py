"""``nvtrain run`` ending before training starts: unresolvable peers, a bad policy, ``--dry-run``.

Nothing may be started in these cases: no ft_launcher process, no events file, no state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.proc_helpers import BIN, LAUNCHER_MODULE, NvtrainRunner, make_policy, read_events, write_policy

pytestmark = pytest.mark.slow

POD0 = "proc-test-0.proc-test.default.svc.nvtrain-test.invalid"


def _dns_policy(tmp_path: Path) -> Path:
    policy, _ = make_policy(
        tmp_path,
        script=str(BIN / "noop_worker.py"),
        nproc=1,
        rendezvous={"nodes": 2, "dns_timeout": "3s", "cluster_domain": "nvtrain-test.invalid"},
    )
    return policy


def test_unresolvable_pod0_exits_3(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    policy = _dns_policy(tmp_path)
    started = time.monotonic()
    run = nvtrain.start(str(policy), env={"JOB_COMPLETION_INDEX": "1", "NVTRAIN_RUN_ID": "dns-1"})
    code = run.wait(timeout=30)
    took = time.monotonic() - started
    assert code == 3, run.describe()
    assert took < 10, f"took {took:.1f}s with dns_timeout = 3s\n{run.describe()}"
    err = run.stderr
    assert f"{POD0} did not resolve within 3s" in err, run.describe()
    for hint in ("subdomain", "publishNotReadyAddresses", "headless Service"):
        assert hint in err, run.describe()
    assert "Traceback" not in err
    assert not run.launcher_seen(), run.seen
    assert "WORKER RAN" not in run.stdout


def test_dns_timeout_is_recorded_in_the_events_log(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    # The events log is the run's record ("launcher start and exit", docs/architecture.md);
    # `nvtrain report` reads it. A launcher_start must be closed by a launcher_exit that says why.
    policy = _dns_policy(tmp_path)
    run = nvtrain.start(str(policy), env={"JOB_COMPLETION_INDEX": "1", "NVTRAIN_RUN_ID": "dns-2"})
    assert run.wait(timeout=30) == 3, run.describe()
    events = read_events(tmp_path / "ckpt" / "dns-2")
    names = [e["event"] for e in events]
    assert "launcher_start" in names, names  # the run is on record from the start...
    assert names[-1] == "launcher_exit", names  # ...so its end must be too
    assert events[-1]["exit_code"] == 3
    assert POD0 in events[-1]["cause"]


def test_bad_policy_exits_2_before_anything_starts(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    policy, tables = make_policy(tmp_path, script=str(BIN / "noop_worker.py"))
    tables["heartbeat"]["initial_timeout"] = "2s"  # shorter than timeout = "4s": an error
    write_policy(tmp_path, tables)
    run = nvtrain.start("--run-id", "bad-1", str(policy))
    code = run.wait(timeout=30)
    assert code == 2, run.describe()
    assert "initial_timeout" in run.stderr and "error" in run.stderr, run.describe()
    assert "WORKER RAN" not in run.stdout
    assert not run.launcher_seen(), run.seen
    assert not (tmp_path / "ckpt").exists()
    assert list(nvtrain.tmpdir.iterdir()) == []


def test_unknown_key_is_a_bad_policy(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    policy, tables = make_policy(tmp_path, script=str(BIN / "noop_worker.py"))
    tables["job"]["nprocs_per_node"] = 2
    write_policy(tmp_path, tables)
    run = nvtrain.start("--run-id", "bad-2", str(policy))
    assert run.wait(timeout=30) == 2, run.describe()
    assert "nprocs_per_node" in run.stderr
    assert not run.launcher_seen() and not (tmp_path / "ckpt").exists()


def _check_dry_run(run_stdout: str, run_id: str, port: int) -> list[str]:
    plan = json.loads(run_stdout)
    argv = plan["argv"]
    assert argv[:4] == [sys.executable, "-m", "nvtrain.nvrx.ftmain", LAUNCHER_MODULE]
    assert f"--rdzv-endpoint=127.0.0.1:{port}" in argv
    assert f"--rdzv-id={run_id}" in argv
    assert plan["env"]["NVTRAIN_RUN_ID"] == run_id
    assert plan["is_host"] is True and plan["wait_for"] is None
    return argv


def test_dry_run_prints_the_plan_and_starts_nothing(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    policy, tables = make_policy(tmp_path, script=str(BIN / "noop_worker.py"), args=["--a", "1"])
    run = nvtrain.start("--dry-run", "--run-id", "dry-1", str(policy))
    assert run.wait(timeout=30) == 0, run.describe()
    argv = _check_dry_run(run.stdout, "dry-1", tables["rendezvous"]["port"])
    assert argv[-3:] == [str(BIN / "noop_worker.py"), "--a", "1"]
    assert "WORKER RAN" not in run.stdout
    assert not run.launcher_seen(), run.seen
    assert not (tmp_path / "ckpt").exists()
    assert list(nvtrain.tmpdir.iterdir()) == []


def test_script_arguments_after_double_dash(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    # `nvtrain run --help`: "Extra arguments for the training script (after --)". The "--" is
    # nvtrain's separator; passed on, it would make the script's argparse treat "--lr" as a
    # positional ("unrecognized arguments: --lr 0.5").
    policy, tables = make_policy(tmp_path, script=str(BIN / "noop_worker.py"), args=["--a", "1"])
    run = nvtrain.start("--dry-run", "--run-id", "dry-2", str(policy), "--", "--lr", "0.5")
    assert run.wait(timeout=30) == 0, run.describe()
    argv = _check_dry_run(run.stdout, "dry-2", tables["rendezvous"]["port"])
    assert argv[-5:] == [str(BIN / "noop_worker.py"), "--a", "1", "--lr", "0.5"]


def test_dry_run_after_the_policy_starts_nothing(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    # `nvtrain run policy.toml --dry-run` must not train: honour the option or refuse it
    # (exit 2), but never pass it on to the script and start the job for real.
    policy, _ = make_policy(tmp_path, script=str(BIN / "noop_worker.py"), max_restarts=0)
    run = nvtrain.start(str(policy), "--dry-run", "--run-id", "dry-3")
    code = run.wait(timeout=60)
    assert "WORKER RAN" not in run.stdout, run.describe()
    assert not run.launcher_seen(), run.describe()
    assert code in (0, 2), run.describe()


def test_unwritable_checkpoint_dir_is_a_clear_error(tmp_path: Path) -> None:
    """A checkpoint dir the pod cannot write ends with exit 2 and names the key, not a traceback."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[job]\nname = "ro"\nmodule = "nvtrain.demo"\n'
        f'[checkpoint]\ndir = "{blocker}/ckpt"\n[restart.in_process]\nenabled = false\n'
    )
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "nvtrain", "run", str(policy), "--run-id", "ro-1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f'[checkpoint] dir = "{blocker}/ckpt"' in result.stderr
    assert "fix:" in result.stderr
    # The refused start leaves no state behind (the resolved policy's folder is never made).
    assert list(tmpdir.iterdir()) == []

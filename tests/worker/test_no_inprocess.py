"""NVRx without in-process restart (a future release may drop the deprecated ``inprocess``).

A real 2-rank demo run with the policy's in-process layer on, under an NVRx whose
``nvidia_resiliency_ext.inprocess`` cannot be imported (a ``sitecustomize`` on PYTHONPATH hides
it from the launcher, ft_launcher and the workers alike): ``nvtrain run`` says so once at start,
an exception in the training function is restarted by ft_launcher (in job) with one line that
says why, and the run ends at its last step.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.worker_helpers import assert_clean_exit, demo_tables, run_nvtrain, write_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HIDE = """
import importlib.abc
import sys


class _NoInprocess(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "nvidia_resiliency_ext.inprocess" or name.startswith("nvidia_resiliency_ext.inprocess."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoInprocess())
"""

STEPS = 24


def test_without_inprocess_a_soft_fault_is_restarted_in_job(tmp_path: Path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE, encoding="utf-8")
    path = os.pathsep.join(p for p in (str(hide), os.environ.get("PYTHONPATH", "")) if p)
    checkpoints = tmp_path / "ckpt"
    tables = demo_tables(checkpoints, name="no-inprocess", ranks=2, steps=STEPS)
    policy = write_policy(tmp_path / "p.toml", tables, [{"step": 12, "rank": 1, "kind": "exception"}])

    run = run_nvtrain(policy, "no-inprocess", checkpoints, tmp_path, 240.0, extra_env={"PYTHONPATH": path})

    assert_clean_exit(run)
    said = [line for line in run.output.splitlines() if "has no in-process restart" in line]
    assert len(said) == 1, run.describe()
    assert "nvidia_resiliency_ext.inprocess is missing" in said[0]
    at_fault = [line for line in run.output.splitlines() if "no in-process restart with this NVRx" in line]
    # The faulty rank says it; its peer, whose collective then fails, may say it too.
    assert any(line.startswith("nvtrain: rank 1: InjectedFault") for line in at_fault), run.describe()
    restarts = [e for e in run.events if e["event"] == "restart_begin"]
    assert restarts and {e.get("layer") for e in restarts} == {"in_job"}, restarts
    steps = {e["step"] for e in run.events if e["event"] == "step"}
    assert max(steps) == STEPS

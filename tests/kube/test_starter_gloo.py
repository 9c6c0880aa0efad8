"""The starter of ``nvtrain init`` edited for one CPU machine as its header says (2 workers,
gloo, a checkpoint folder of one's own, an injected exception): ``nvtrain validate`` finds
nothing, and the collective timeout that ``nvtrain run`` hands the workers is the one derived
for gloo (3/4 of the in-process soft timeout), not the 10 minutes a written value used to keep.
How fast the run recovers is a benchmark's business, not this test's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.ports import free_port_pair
from support.proc_helpers import BIN, NvtrainRunner

pytestmark = pytest.mark.slow

GLOO_COLLECTIVE = 45.0
"""3/4 of the starter's in-process soft timeout (1 minute, its default)."""


def nvtrain_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvtrain", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def edited(text: str, values: dict[tuple[str, str], str]) -> str:
    """``text`` with each ``[table] key`` set (uncommented when it was commented out) as a user
    edits the starter; the ``[[faults]]`` table is uncommented as its comment says."""
    lines = text.replace("\n# [[faults]]\n", "\n[[faults]]\n").splitlines()
    table, done = "", set()
    for i, line in enumerate(lines):
        if header := re.match(r"^\[\[?([\w.]+)\]\]?$", line):
            table = header.group(1)
        elif (assign := re.match(r"^(?:# )?(\w+) = ", line)) and (table, assign.group(1)) in values:
            lines[i] = f"{assign.group(1)} = {values[(table, assign.group(1))]}"
            done.add((table, assign.group(1)))
    assert done == set(values), f"not in the starter: {set(values) - done}"
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gloo", "auto"])
def test_starter_edited_for_cpu_validates_clean_and_hands_the_gloo_timeout_on(
    nvtrain: NvtrainRunner, tmp_path: Path, backend: str
) -> None:
    """``backend = "gloo"`` as the header says, or left at ``"auto"``: validate cannot know that
    "auto" is gloo here (it shows the NCCL default), but ``nvtrain run`` on this GPU-less node
    hands the workers the gloo timeout all the same."""
    project = tmp_path / "project"
    made = nvtrain_cli("init", str(project), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    policy = project / "policy.toml"
    text = edited(
        policy.read_text(encoding="utf-8"),
        {
            ("job", "nproc_per_node"): "2",
            ("job", "backend"): json.dumps(backend),
            ("job", "max_steps"): "20",
            ("rendezvous", "port"): str(free_port_pair()),
            ("checkpoint", "dir"): json.dumps(str(tmp_path / "checkpoints")),
            ("faults", "step"): "5",
            ("faults", "rank"): "1",
            ("faults", "kind"): '"exception"',
        },
    )
    policy.write_text(text, encoding="utf-8")

    checked = nvtrain_cli("validate", str(policy), "--strict", cwd=project)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "warning" not in checked.stderr and "error" not in checked.stderr, checked.stderr
    effective = dict(
        re.findall(r"^  (\[[\w.]+\] \w+) = (.*?)(?:  \(default\))?$", checked.stdout, re.MULTILINE)
    )
    shown = f'"{GLOO_COLLECTIVE:.0f}s"' if backend == "gloo" else '"10m"'
    assert effective["[job] collective_timeout"] == shown, checked.stdout
    assert effective["[restart.in_process] soft_timeout"] == '"1m"', checked.stdout
    assert effective["[checkpoint] interval"] == "2", checked.stdout  # a tenth of max_steps

    planned = nvtrain_cli("run", "--dry-run", str(policy), cwd=project)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert "--nproc-per-node=2" in plan["argv"]
    if backend == "gloo":
        assert "NCCL_NVLS_ENABLE" not in plan["env_defaults"]  # gloo: no NCCL settings

    # What the workers get: the policy `nvtrain run` hands them, loaded as the worker library does.
    run = nvtrain.start(
        "--run-id", f"starter-{backend}", "--policy", str(policy), str(BIN / "policy_worker.py")
    )
    code = run.wait(timeout=90)
    assert code == 0, run.describe()
    seen = re.findall(r"WORKER COLLECTIVE rank=(\d) backend=(\w+) seconds=([\d.]+)", run.stdout)
    assert sorted(seen) == [(str(r), backend, str(GLOO_COLLECTIVE)) for r in (0, 1)], run.describe()

"""A healthy run prints nothing of NVRx's or torch's that needs no action (issue 52, item 4).

The CPU demo, 2 ranks under ``nvtrain run``, the real ft_launcher and NVRx's in-process
Wrapper, no faults. Before, its terminal held: torch's ``pynvml`` FutureWarning once per process
that imports torch, ft_launcher's ``OMP_NUM_THREADS`` banner, NVRx 0.4's two lines that its GPU
health check is off on a machine without NVML, and the Wrapper's ``logging not initialized``
warning once per worker. Each is now configured away (``nvtrain.nvrx.logs``, the plan's
environment defaults); docs/run.md, "What a healthy run prints", explains what is left.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.proc_helpers import NvtrainRunner, make_policy, read_events, write_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STEPS = 6
NOISE = [
    r"Warning\b",  # any warnings.warn of NVRx or torch (FutureWarning, UserWarning, ...)
    r"\bwarnings\.warn\(",
    r"import pynvml",
    r"OMP_NUM_THREADS",
    r"Health checks",  # GPU Health checks disabled ..., Health checks are disabled ...
    r"logging not initialized",
    r"gpu_ib_map is empty",
    r"No network devices found",
    r"Progress tracking is enabled",
    r"Failed to get GPU memory information",
    r"\[(WARNING|ERROR)\]",  # ft_launcher's records: none is due in a healthy run
]


def test_a_healthy_demo_run_prints_no_warning_that_needs_no_action(
    nvtrain: NvtrainRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the user's shell may set would hide the banner and the warnings before the change too.
    for name in ("OMP_NUM_THREADS", "PYTHONWARNINGS"):
        monkeypatch.delenv(name, raising=False)
    _, tables = make_policy(
        tmp_path,
        module="nvtrain.demo",
        args=["--steps", str(STEPS), "--step-time", "0", "--log-every", "3"],
        nproc=2,
        max_restarts=0,
        heartbeat={"timeout": "20s"},  # past the in-process layer's timeouts, as the demo's
    )
    tables["job"].update({"max_steps": STEPS, "backend": "gloo", "collective_timeout": "5s"})
    tables["restart.in_process"] = {"enabled": True, "soft_timeout": "10s", "hard_timeout": "15s"}
    tables["checkpoint"].update({"interval": 3, "async": True, "keep": 2})
    run = nvtrain.start("--run-id", "quiet-1", str(write_policy(tmp_path, tables)))
    assert run.wait(timeout=180) == 0, run.describe()

    events = read_events(tmp_path / "ckpt" / "quiet-1")
    assert [e["step"] for e in events if e["event"] == "checkpoint_committed"][-1] == STEPS, events
    assert any(e["event"] == "rendezvous_done" for e in events), events  # ft_launcher ran
    noise = [
        line
        for line in (run.stdout + run.stderr).splitlines()
        if any(re.search(pattern, line) for pattern in NOISE)
    ]
    assert noise == [], run.describe()

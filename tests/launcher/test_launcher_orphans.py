"""A SIGKILLed ``nvtrain run`` takes its launcher tree with it (real ft_launcher, 2 workers).

nvtrain cannot clean up after a SIGKILL, so ft_launcher is started with a parent-death signal
(SIGTERM): it stops its workers as on any SIGTERM (SIGKILL after ``--term-timeout``, which is
``[job] stop_timeout``) and its rank monitors, then exits. Every process of the run carries the
test's token in its environment, whoever its parent is by then, so none can hide.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from support.proc_helpers import BIN, NvtrainRunner, make_policy, processes_with_token

pytestmark = pytest.mark.slow

# stop_timeout (3 s) for the workers, ft_launcher's own exit and the rank monitors' shutdown,
# with room for a loaded 2-core machine.
_GONE_WITHIN = 30.0


def _left_after(token: str, deadline: float) -> list[str]:
    """The processes of the run still alive at ``deadline`` (or [] as soon as none is)."""
    while True:
        left = processes_with_token(token)
        if not left or time.monotonic() >= deadline:
            return [f"{p.pid} {' '.join(p.cmdline())}" for p in left]
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("worker", "args", "marker"),
    [
        # workers that stop on SIGTERM, and workers that only SIGKILL stops
        ("fail_worker.py", ["--fail-rank", "-1"], r"WORKER START rank=\d restart=0 pid=(\d+)"),
        ("ignore_term_worker.py", [], r"WORKER READY rank=\d pid=(\d+)"),
    ],
    ids=["obeys-sigterm", "ignores-sigterm"],
)
def test_sigkilled_run_leaves_no_process(
    nvtrain: NvtrainRunner, tmp_path: Path, worker: str, args: list[str], marker: str
) -> None:
    policy, _ = make_policy(tmp_path, script=str(BIN / worker), args=args, nproc=2, stop_timeout="3s")
    run = nvtrain.start("--run-id", "orphans-1", str(policy))
    workers = {int(m.group(1)) for m in run.wait_for_stdout(marker, count=2, timeout=90)}
    running = {p.pid for p in processes_with_token(run.token)}
    assert len(workers) == 2 and workers <= running, run.describe()
    assert run.launcher_seen(), run.describe()

    run.proc.kill()
    killed = time.monotonic()
    assert run.wait(timeout=10) == -9
    left = _left_after(run.token, killed + _GONE_WITHIN)
    took = time.monotonic() - killed
    assert left == [], f"still running {took:.0f}s after the SIGKILL:\n" + "\n".join(left)

"""What a finished run left: ``nvtrain report --json``, the events of every pod."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nvtrain.events import Event


def src_env(src: str | Path | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``src`` first on ``PYTHONPATH``
    (``None``: unchanged), so that a child runs that tree's nvtrain."""
    env = dict(os.environ if base is None else base)
    if src:
        rest = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
        env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), *rest])
    return env


def report_json(
    run_dir: Path,
    *,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    keep: int = 500,
) -> dict[str, Any]:
    """``nvtrain report RUN_DIR --json EXTRA...`` (this tree's nvtrain unless ``env`` says
    otherwise) as a dict; ``{"error": <the end of its stderr>}`` when it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "nvtrain", "report", str(run_dir), "--json", *extra],
        capture_output=True,
        text=True,
        check=False,
        env=None if env is None else dict(env),
        timeout=timeout,
    )
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip()[-keep:]}
    return dict(json.loads(done.stdout))


def run_events(run_dir: Path) -> list[Event]:
    """Every pod's events in ``run_dir`` (``events-node<N>.jsonl``; an older run's
    ``events.jsonl``), merged in time order; [] before any was written."""
    from nvtrain.events import read_events
    from nvtrain.runlog import pod_files

    return sorted((e for path in pod_files(run_dir) for e in read_events(path)), key=lambda e: e.ts)

"""The in-process section of ``nvtrain run --dry-run``: the arguments of NVRx's ``Wrapper``.

Plain lines on stderr, after the launch plan's JSON on stdout (which stays JSON for tools).
"""

from __future__ import annotations

import sys

from nvtrain.config.wrapper_plan import WrapperPlan

__all__ = ["print_wrapper_plan"]

TITLE = "in-process restart (NVRx Wrapper)"


def print_wrapper_plan(
    plan: WrapperPlan | None, nvrx: str, off: str = "[restart.in_process] enabled = false"
) -> None:
    """``plan`` as the workers pass it, for ``nvtrain`` (a version, or what stands for one);
    None: in-process restart is off, for the reason ``off``."""
    if plan is None:
        lines = [f"{TITLE}: off ({off})"]
    else:
        lines = [f"{TITLE}, with {nvrx}:"]
        lines += [f"  {name} = {value}" for name, value in plan.rows()]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()

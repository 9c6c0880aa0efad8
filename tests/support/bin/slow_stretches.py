"""A one-rank training script with three long stretches of Python code that are not hangs: a
save whose extra state takes SLOW seconds to collect (step 5), an evaluation of SLOW seconds
in ``ctx.section()`` (step 8) and a final one after ``ctx.training_done()`` (no step comes any
more). Run under ``nvtrain run`` with a soft timeout shorter than SLOW.

    python slow_stretches.py SLOW
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

import nvtrain.worker as nw

SLOW = float(sys.argv[1])


def busy(seconds: float) -> None:
    """Python code running for ``seconds`` (short sleeps: the machine has 2 cores)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)


class SlowLoaderState:
    """Stands in for a data loader whose position is slow to collect."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        if self.position == 5:
            busy(SLOW)
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


def main(ctx: nw.Context) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = SlowLoaderState()
    ctx.checkpointer(model, optimizer, extra={"loader": loader})
    for step in range(ctx.start_step + 1, 13):
        loss = model(torch.ones(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        loader.position = step
        if step == 8:
            with ctx.section():
                busy(SLOW)  # an evaluation
        ctx.step_done(step)
    ctx.training_done()
    busy(SLOW)  # a final evaluation
    print("SLOW STRETCHES DONE", flush=True)


if __name__ == "__main__":
    nw.run(main)

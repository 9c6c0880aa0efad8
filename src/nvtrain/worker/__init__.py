"""What a training script imports: ``run(main)`` and the ``Context`` it gets.

    import nvtrain.worker as nw

    def main(ctx: nw.Context) -> None:
        model, optimizer = build()
        ctx.checkpointer(model, optimizer)          # restores the newest checkpoint
        for step in range(ctx.start_step + 1, max_steps + 1):
            train_one_step(model, optimizer, step)
            ctx.step_done(step)                     # heartbeat, checkpoint when due, faults

    if __name__ == "__main__":
        nw.run(main)

This package imports torch; NVRx is imported only when in-process restart or heartbeats are on.
"""

from nvtrain.worker.checkpoint import Checkpointer, CorruptCheckpoint, committed_steps
from nvtrain.worker.context import Context, KeptStateLost
from nvtrain.worker.faults import InjectedFault
from nvtrain.worker.restart import run
from nvtrain.worker.stopping import Stopped

__all__ = [
    "Checkpointer",
    "Context",
    "CorruptCheckpoint",
    "InjectedFault",
    "KeptStateLost",
    "Stopped",
    "committed_steps",
    "run",
]

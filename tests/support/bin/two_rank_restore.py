"""One rank of a 2-rank gloo job that saves steps 10 and 20, then restores twice with fresh models.

    two_rank_restore.py RUN_DIR OUT_JSON HIDE_STEP      (RANK, WORLD_SIZE, MASTER_* in the env)

The first restore sees the directory as it is. For the second, a rank given HIDE_STEP > 0 does
not see the committed checkpoint of that step, as when its directory listing was taken just
before another rank's commit renamed the folder (a commit of an earlier attempt landing while an
in-process restart restores). Writes both restored steps to OUT_JSON.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import nvtrain.worker.checkpoint as checkpoint
import nvtrain.worker.checkpoint.agreement as agreement
from nvtrain.config.schema import Checkpoint


def model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def main() -> None:
    run_dir, out, hide = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    policy = Checkpoint.model_validate({"dir": "/unused", "interval": 10, "async": False, "keep": 3})
    model, optimizer = model_and_optimizer(0)
    saver = checkpoint.Checkpointer(model=model, optimizer=optimizer, run_dir=run_dir, policy=policy)
    for step in (10, 20):
        model(torch.randn(2, 8, generator=torch.Generator().manual_seed(step))).sum().backward()
        optimizer.step()
        saver.save(step)
    saver.close()
    dist.barrier()
    listed = agreement.committed_steps  # what each rank's restore lists (rank 0's is agreed)

    def listing_without_hidden_step(path: Path) -> list[int]:
        return [s for s in listed(path) if s != hide]

    steps = []
    for attempt in (1, 2):
        if attempt == 2 and hide:
            agreement.committed_steps = listing_without_hidden_step
        fresh_model, fresh_optimizer = model_and_optimizer(attempt)
        restorer = checkpoint.Checkpointer(
            model=fresh_model, optimizer=fresh_optimizer, run_dir=run_dir, policy=policy
        )
        steps.append(restorer.restore())
        dist.barrier()
    out.write_text(json.dumps({"rank": dist.get_rank(), "steps": steps}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

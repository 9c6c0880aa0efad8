"""One rank of a 4-rank gloo job on two emulated pods (2 ranks each; the pod's host-copy folder
is ``NVTRAIN_HOST_COPY_DIR``), with a DDP model and async saves whose copies are also kept by a
rank of the other pod (``peercopy``).

    peer_copies.py save RUN_DIR OUT_JSON       train 20 steps, save steps 10 and 20, close
    peer_copies.py restore RUN_DIR OUT_JSON    restore into a fresh model, twice

(RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_* in the env.) OUT_JSON gets the digest of the
state saved at step 20, or of what each restore brought back.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from nvtrain.config.schema import Checkpoint
from nvtrain.events import EventLog
from nvtrain.worker.checkpoint import Checkpointer

RUN_ID = "peer-copies"


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 8)))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


class Position:
    """Per-rank state besides the model (a data loader's position): each rank's differs, so a
    rank that loaded another rank's copy would not end with its own digest."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen = state["seen"]


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer, position: Position) -> str:
    h = hashlib.sha256(str(position.seen).encode())
    for name, value in sorted(model.state_dict().items()):
        h.update(name.encode() + value.detach().numpy().tobytes())
    for state in optimizer.state.values():
        for key, value in sorted(state.items()):
            h.update(key.encode() + value.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    mode, run_dir, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    events = EventLog(run_dir / "events.jsonl", source="worker", rank=rank)
    policy = Checkpoint.model_validate({"dir": "/unused", "interval": 10, "async": True, "keep": 3})

    def checkpointer(
        model: torch.nn.Module, optimizer: torch.optim.Optimizer, position: Position
    ) -> Checkpointer:
        return Checkpointer(
            model=model,
            optimizer=optimizer,
            run_dir=run_dir,
            policy=policy,
            events=events,
            run_id=RUN_ID,
            extra={"position": position},
        )

    result: dict[str, object] = {"rank": rank}
    if mode == "save":
        model, optimizer = build(0)
        position = Position()
        saver = checkpointer(model, optimizer, position)
        for step in range(1, 21):
            position.seen += 100 * rank + step
            x = torch.randn(4, 64, generator=torch.Generator().manual_seed(step * 10 + rank))
            model(x).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 10 == 0:
                saver.save(step)
        saver.close()
        result["saved"] = digest(model, optimizer, position)
    else:
        restored = []
        for attempt in (1, 2):
            model, optimizer = build(attempt)
            position = Position()
            step = checkpointer(model, optimizer, position).restore()
            restored.append({"step": step, "digest": digest(model, optimizer, position)})
            dist.barrier()
        result["restored"] = restored
    dist.barrier()
    dist.destroy_process_group()
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()

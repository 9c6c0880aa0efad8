"""One rank of a 2-rank gloo job with a DDP model: saves steps 10 and 20, restores into a fresh
model (step 20, bitwise), then damages one byte of rank 1's shard of step 20 and restores again:
both ranks must report the damage and fall back to step 10, bitwise (restores from storage:
``in_memory`` off, or the copy still in host memory would be used).

    two_rank_ddp_corrupt.py RUN_DIR OUT_JSON      (RANK, WORLD_SIZE, MASTER_* in the env)
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
from nvtrain.events import EventLog, read_events
from nvtrain.worker.checkpoint import Checkpointer


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        h.update(name.encode() + value.detach().numpy().tobytes())
    for state in optimizer.state.values():
        for key, value in sorted(state.items()):
            h.update(key.encode() + value.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    events = EventLog(run_dir / "events.jsonl", source="worker", rank=rank)
    policy = Checkpoint.model_validate(
        {"dir": "/unused", "interval": 10, "async": True, "keep": 3, "in_memory": False}
    )
    model, optimizer = build(0)
    saver = Checkpointer(model=model, optimizer=optimizer, run_dir=run_dir, policy=policy, events=events)
    saved = {}
    for step in range(1, 21):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step * 10 + rank))
        model(x).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 10 == 0:
            saver.save(step)
            saved[step] = digest(model, optimizer)
    saver.close()
    dist.barrier()

    restored = []
    for attempt in (1, 2):
        if attempt == 2:
            if rank == 1:
                shard = sorted((run_dir / "step-000020").glob("__1_*.distcp"))[0]
                data = bytearray(shard.read_bytes())
                data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
                shard.write_bytes(bytes(data))
            dist.barrier()
        fresh_model, fresh_optimizer = build(attempt)
        step = Checkpointer(
            model=fresh_model, optimizer=fresh_optimizer, run_dir=run_dir, policy=policy, events=events
        ).restore()
        restored.append({"step": step, "same": digest(fresh_model, fresh_optimizer) == saved.get(step)})
        dist.barrier()
    corrupt = [e.as_dict() for e in read_events(run_dir / "events.jsonl") if e.name == "checkpoint_corrupt"]
    out.write_text(json.dumps({"rank": rank, "restored": restored, "corrupt": corrupt}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

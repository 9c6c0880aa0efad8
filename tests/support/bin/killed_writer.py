"""A checkpoint writer killed in the middle of an async write.

    killed_writer.py RUN_DIR EVENTS STATE_MB OUT_JSON

Builds a model whose model + AdamW state is about STATE_MB MB, saves step 10 synchronously
(committed; the state's hash goes to OUT_JSON with suffix .step10.json), trains one more step,
starts an async save of step 20 and, right after its ``checkpoint_staged`` event, waits until
the background write has put bytes into the step-20 shard, records what the partial folder
holds (OUT_JSON), and SIGKILLs itself. The test imports ``build`` and ``state_hash`` to restore.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from nvtrain.config.schema import Checkpoint
from nvtrain.events import Event, EventLog
from nvtrain.events.records import CheckpointStaged
from nvtrain.worker import Checkpointer

WIDTH = 1024


def build(state_mb: int, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    layers = max(1, round(state_mb * 1e6 / (12 * WIDTH * WIDTH)))  # fp32 param + 2 AdamW moments
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train(model, optimizer, seed)
    return model, optimizer


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(seed))
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def state_hash(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        digest.update(name.encode() + value.detach().contiguous().numpy().tobytes())
    for pid, state in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(state.items()):
            digest.update(f"{pid}.{key}".encode() + value.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def write_json(path: Path, data: dict[str, Any]) -> None:
    with path.open("w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())


class KillAfterStaged(EventLog):
    """Emits as usual; after step 20's checkpoint_staged, records the write in progress and dies."""

    def __init__(self, path: Path, run_dir: Path, out: Path) -> None:
        super().__init__(path, run_id="killed-writer", source="test")
        self.run_dir = run_dir
        self.out = out

    def emit(self, event: Event) -> dict[str, Any]:
        record = super().emit(event)
        if isinstance(event, CheckpointStaged) and event.step == 20:
            (partial,) = self.run_dir.glob("step-000020.partial-*")
            deadline = time.monotonic() + 60
            shard_bytes = 0
            while time.monotonic() < deadline:
                shard_bytes = sum(p.stat().st_size for p in partial.glob("__0_*"))
                if shard_bytes > 0:
                    break
                time.sleep(0.001)
            files = {p.name: p.stat().st_size for p in partial.iterdir()}
            write_json(
                self.out,
                {
                    "partial": partial.name,
                    "files": files,
                    "shard_bytes": shard_bytes,
                    "state_bytes": event.bytes,
                },
            )
            os.kill(os.getpid(), signal.SIGKILL)
        return record


def main() -> None:
    run_dir, events, state_mb, out = sys.argv[1:5]
    run_path, out_path = Path(run_dir), Path(out)
    sync = Checkpoint.model_validate({"dir": "/unused", "interval": 10, "async": False, "keep": 3})
    async_ = Checkpoint.model_validate({"dir": "/unused", "interval": 10, "async": True, "keep": 3})
    model, optimizer = build(int(state_mb), seed=1)
    log = EventLog(Path(events), run_id="killed-writer", source="test")
    first = Checkpointer(model=model, optimizer=optimizer, run_dir=run_path, policy=sync, events=log)
    first.save(10)
    first.close()
    write_json(out_path.with_suffix(".step10.json"), {"hash": state_hash(model, optimizer)})
    train(model, optimizer, seed=3)
    killer = KillAfterStaged(Path(events), run_path, out_path)
    second = Checkpointer(model=model, optimizer=optimizer, run_dir=run_path, policy=async_, events=killer)
    second.save(20)
    print("the async save returned without the kill", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main()

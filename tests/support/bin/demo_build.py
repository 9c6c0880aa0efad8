"""One rank of a gloo job (world size from the env, 1 without one): the demo's model built
uninitialised (``init=False``) and then ``initialise``d must equal a normal build, parameter by
parameter (FSDP2 shards when the world is larger than 1).

    demo_build.py OUT_JSON
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

from nvtrain.demo.__main__ import build, initialise


def main() -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    ctx = SimpleNamespace(
        device=torch.device("cpu"), world_size=world, rank=dist.get_rank() if world > 1 else 0
    )
    normal, _ = build(ctx, 96, 2)  # type: ignore[arg-type]
    empty, optimizer = build(ctx, 96, 2, init=False)  # type: ignore[arg-type]
    initialise(ctx, empty, 96, 2)  # type: ignore[arg-type]

    def full(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    same = [
        bool(torch.equal(full(a), full(b)))
        for a, b in zip(normal.parameters(), empty.parameters(), strict=True)
    ]
    owned = all(p in {q for g in optimizer.param_groups for q in g["params"]} for p in empty.parameters())
    sharded = [type(p).__name__ for p in empty.parameters()]
    if world > 1:
        dist.destroy_process_group()
    with open(sys.argv[1], "w") as out:
        json.dump({"same": same, "optimizer_owns": owned, "types": sharded}, out)


if __name__ == "__main__":
    main()

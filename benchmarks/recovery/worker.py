"""A torchrun-style gloo worker that SIGKILLs one rank at predetermined steps.

Reads RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT (set by torchrun or ft_launcher) and nothing
else from the launcher. Every rank prints one line per event, each with a wall-clock time
(``time.time()``), so a driver can measure recovery from the combined log:

    BENCH start rank=R pid=P restart=N ts=T          process started (before importing torch)
    BENCH built rank=R pid=P restart=N ts=T          torch imported, model and optimizer built
    BENCH ready rank=R pid=P restart=N ts=T step=S   process group up, resuming at step S
    BENCH step  rank=0 pid=P restart=N ts=T step=S   step S completed (rank 0 only)
    BENCH fault rank=R pid=P restart=N ts=T step=S   about to SIGKILL itself
    BENCH done  rank=R pid=P restart=N ts=T step=S   finished every step

Each fault fires once per run, even across restarts: before killing itself the rank records
the step in ``<state-dir>/fired.json`` (written and fsynced first). Rank 0 saves the last
completed step to ``<state-dir>/step.json`` after every step (temporary file, fsync,
``os.replace``), and a restarted group resumes from the step after it.
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402


def _say(kind: str, rank: int, ts: float, **fields: object) -> None:
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    extra = "".join(f" {k}={v}" for k, v in fields.items())
    line = f"BENCH {kind} rank={rank} pid={os.getpid()} restart={restart} ts={ts:.6f}{extra}\n"
    # One write(2) per line: lines from both ranks share one pipe and must not interleave.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), line.encode())


def _write_json(path: Path, data: object) -> None:
    """Write ``data`` to ``path`` atomically and durably: temp file, fsync, rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _read_json(path: Path, default: object) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--step-time", type=float, default=0.05, help="sleep per step, seconds")
    parser.add_argument("--faults", default="", help="comma-separated steps at which a rank dies")
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument(
        "--state-dir",
        default=os.environ.get("BENCH_STATE_DIR"),
        help="where the step checkpoint and fired faults live (default: $BENCH_STATE_DIR)",
    )
    args = parser.parse_args()
    if not args.state_dir:
        parser.error("--state-dir or BENCH_STATE_DIR is required")
    state = Path(args.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    step_file, fired_file = state / "step.json", state / "fired.json"
    faults = {int(s) for s in args.faults.split(",") if s.strip()}

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _say("start", rank, STARTED)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # its first use imports more of torch
    params = list(model.parameters())
    # Everything before this line is local CPU work; what follows depends on the launcher
    # (MASTER_ADDR/MASTER_PORT, the store) and on the other rank.
    _say("built", rank, time.time())

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    saved = _read_json(step_file, {"step": 0})
    assert isinstance(saved, dict)
    first = int(saved["step"]) + 1
    # Both ranks must resume at the same step: rank 0's view of the checkpoint wins.
    agreed = torch.tensor([first])
    dist.broadcast(agreed, src=0)
    first = int(agreed.item())
    _say("ready", rank, time.time(), step=first)

    for step in range(first, args.steps + 1):
        if rank == args.fault_rank and step in faults:
            fired = _read_json(fired_file, [])
            assert isinstance(fired, list)
            if step not in fired:
                _write_json(fired_file, [*fired, step])
                _say("fault", rank, time.time(), step=step)
                os.kill(os.getpid(), signal.SIGKILL)
        # Deterministic data: a function of (rank, step) only, so a resumed run sees the same batches.
        generator = torch.Generator().manual_seed(rank * 1_000_003 + step)
        x = torch.randn(32, 64, generator=generator)
        loss = ((model(x) - x.sum(dim=1, keepdim=True) / 8) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for p in params:
            assert p.grad is not None
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
        optimizer.step()
        time.sleep(args.step_time)
        if rank == 0:
            _write_json(step_file, {"step": step})
            _say("step", rank, time.time(), step=step, loss=f"{loss.item():.4f}")

    dist.barrier()
    dist.destroy_process_group()
    _say("done", rank, time.time(), step=args.steps)


if __name__ == "__main__":
    main()

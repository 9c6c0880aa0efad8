"""Records what NVRx's in-process layer says, for the parsers of ``nvtrain.nvrx.messages``.

Runs ``inprocess.Wrapper`` of the installed NVRx (or the one first on PYTHONPATH) on CPU with
gloo, WORLD ranks on this host without a launcher, in one scenario, and writes what each rank
saw to OUT_DIR/<nvrx version>/<scenario>.rank<N>.txt, one message a line, each line
``<what>: <text>``:

- ``interruption``: ``str()`` of the ``RankShouldRestart`` NVRx raised in the main thread;
- ``fn_exception``: ``repr()`` of what the rank's function raised, as NVRx's state holds it;
- ``gave_up``: ``<module>.<class>: str()`` of what ``Wrapper(...)()`` ended with.

    python benchmarks/recovery/record_nvrx_messages.py OUT_DIR SCENARIO [WORLD] [PORT]

Scenarios: ``exception`` (rank 1 raises once), ``soft_timeout`` (rank 1 blocks in one long C
call once), ``max_iterations`` (rank 1 raises in every attempt, ``max_iterations=2``),
``min_world_size`` (rank 1 exits at once, ``min_world_size`` = WORLD); ``rank_sets`` runs nothing
but NVRx's formatter of the interruption message on larger rank sets (``_rank_sets``).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _rank(out: Path, scenario: str, port: int) -> None:
    import torch.distributed as dist
    from nvidia_resiliency_ext import inprocess
    from nvidia_resiliency_ext.inprocess.monitor_thread import RankShouldRestart

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    seen = out / f"{scenario}.rank{rank}.txt"
    lines: list[str] = []

    def note(what: str, text: str) -> None:
        lines.append(f"{what}: {text}")
        seen.write_text("".join(line + "\n" for line in lines), encoding="utf-8")

    class Finalize(inprocess.finalize.Finalize):  # type: ignore[misc]
        def __call__(self, state: Any) -> Any:
            exc = getattr(state, "fn_exception", None)
            if exc is not None:
                note("fn_exception", repr(exc))
            return state

    def train(call_wrapper: Any = None) -> None:
        iteration = call_wrapper.iteration
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port + 2 + iteration}",
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=20),
        )
        try:
            faulty = rank == 1
            if faulty and scenario == "exception" and iteration == 0:
                raise ValueError("injected fault of rank 1")
            if faulty and scenario == "max_iterations":
                raise ValueError(f"injected fault of rank 1, attempt {iteration}")
            if faulty and scenario == "min_world_size":
                os._exit(3)
            if faulty and scenario == "soft_timeout" and iteration == 0:
                time.sleep(12)  # the scenario: one C call past the soft timeout, no bytecode
            if not faulty and (iteration == 0 or scenario == "max_iterations"):
                # The healthy ranks run Python (no collective a dead peer would break) until
                # NVRx interrupts them; the sleep is the scenario's idle training step.
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    time.sleep(0.05)
            for _ in range(3):
                dist.barrier()
        except RankShouldRestart as exc:
            note("interruption", str(exc))
            raise
        finally:
            if dist.is_initialized():  # NVRx's abort destroys it after a fault
                dist.destroy_process_group()

    # NVRx passes its CallWrapper to the parameter annotated with its class (the annotation
    # must be the class itself, not the string this module's future import makes of it).
    train.__annotations__["call_wrapper"] = inprocess.CallWrapper
    wrapper = inprocess.Wrapper(
        store_kwargs={"port": port + 1, "timeout": datetime.timedelta(seconds=60)},
        initialize=inprocess.initialize.RetryController(
            max_iterations=2 if scenario == "max_iterations" else 4,
            min_world_size=world if scenario == "min_world_size" else 1,
        ),
        finalize=Finalize(),
        health_check=None,
        soft_timeout=datetime.timedelta(seconds=4),
        hard_timeout=datetime.timedelta(seconds=30),
        heartbeat_timeout=datetime.timedelta(seconds=8),
        barrier_timeout=datetime.timedelta(seconds=60),
        completion_timeout=datetime.timedelta(seconds=60),
    )
    if hasattr(wrapper, "restart_health_check"):  # 0.6+: its GPU checks fail without a GPU
        wrapper.restart_health_check = wrapper.health_check
    try:
        wrapper(train)()
    except BaseException as exc:  # noqa: BLE001 - what NVRx ended with is the recording
        note("gave_up", f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
        raise SystemExit(1) from None
    note("done", f"rank {rank}")


RANK_SETS = ((1,), (3, 5), tuple(range(8)), tuple(range(16)), (1, 2, 3, 5, 8, 9), tuple(range(2, 40, 3)))
"""The ranks of the interruptions ``rank_sets`` formats: one, a few, up to and past 8 (where
NVRx 0.6+ lists only the first and last four), runs of consecutive ranks (NVRx 0.6+ makes
ranges of them under NVRX_LOG_RANK_FORMAT_VERBOSE)."""


def _rank_sets(out: Path) -> None:
    """``rank_sets``: no run, NVRx's own formatter of the interruption message (the text a
    ``RankShouldRestart`` carries) applied to rank sets no 2-rank run makes, in both of NVRx
    0.6+'s formats; one line each, ``<ranks given>: <message>``."""
    from nvidia_resiliency_ext.inprocess.attribution import (
        Interruption,
        InterruptionRecord,
        format_interruption_records,
    )

    lines = []
    for verbose in ("false", "true"):
        os.environ["NVRX_LOG_RANK_FORMAT_VERBOSE"] = verbose  # read at each call (0.6+)
        for ranks in RANK_SETS:
            records = [InterruptionRecord(rank, Interruption.SOFT_TIMEOUT) for rank in ranks]
            line = f"{','.join(map(str, ranks))}: {format_interruption_records(records)}"
            if line not in lines:
                lines.append(line)
    records = [InterruptionRecord(3, Interruption.EXCEPTION), InterruptionRecord(7, Interruption.TERMINATED)]
    lines.append(f"3: {format_interruption_records(records)}")
    (out / "rank_sets.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def main() -> int:
    out_root, scenario = Path(sys.argv[1]), sys.argv[2]
    world = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    port = int(sys.argv[4]) if len(sys.argv) > 4 else 29810
    version = importlib.metadata.version("nvidia-resiliency-ext")
    out = out_root / version
    out.mkdir(parents=True, exist_ok=True)
    if scenario == "rank_sets":
        _rank_sets(out)
        return 0
    if os.environ.get("RECORD_RANK") is not None:
        _rank(out, scenario, port)
        return 0
    procs = []
    for rank in range(world):
        env = dict(os.environ, RECORD_RANK="1", RANK=str(rank), WORLD_SIZE=str(world))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.pop("LOCAL_RANK", None)  # 0.6+: with LOCAL_RANK set the Wrapper runs NVML checks
        procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env=env))
    codes = [proc.wait(timeout=300) for proc in procs]
    print(f"NVRx {version} {scenario}: exit codes {codes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A host-copy restore, end to end, the way it was and the way it is, side by side (issue 37).

Stages and seals a model + AdamW state of --size bytes (Linear(--width, --width) layers without
bias; 12 bytes per parameter; a smaller --width makes more, smaller tensors) in a private folder
under --folder (/dev/shm), as a save does, then restores it into the live model's tensors
--repeats times per arm, the arms alternating, each time through a new ``HostCopy`` (fresh
mappings, as in a replacement worker) into tensors zeroed beforehand, after a full garbage
collection (so that none owed by the arm before lands in the next):

  two-pass  as before issue 37 (c038217): read and check the header, map the data file (opened
            for writing, posix_fallocate), hash all of it through the mapping (blake3 on every
            core), read and hash the extra file again, then copy each tensor out of the mapping
            (torch's copy, on torch's threads)
  one-pass  ``HostCopy.find`` + ``load`` now: header, MAC, the files' owner and mode, the extra
            file; then the data file copied in chunks straight into the tensors, each chunk
            hashed where it landed while reader threads copy the next ones (``worker/hostread.py``)

Prints per arm the median seconds of each part and in all, the rate (state bytes / seconds, GB =
10^9 bytes), the CPU seconds (all threads), the ratio, the machine's own copy and hash rates and
its load average; checks once per arm that the restored state is the saved one, bitwise. With
--first-step it also runs, in fresh processes, a restore (as the checkpointer does it: the
optimizer's state made by torch's zero-lr step, find, load, set_state_dict) followed by training
steps, and as many processes that train a fresh model without one: the first step against the
median of the later ones. --device cuda puts the live state on the GPU (the H200 run), and adds
fresh processes that start making the restore's page-locked staging buffers at their start, as a
replacement worker does (``restore_ahead.warm_restore``), against ones that make them in the restore.

    python benchmarks/recovery/hostcopy_restore.py --size 4G --repeats 7
    python benchmarks/recovery/hostcopy_restore.py --size 200M --width 64       # 16,276 tensors
    python benchmarks/recovery/hostcopy_restore.py --size 1G --first-step --arms one-pass
    python benchmarks/recovery/hostcopy_restore.py --size 4G --device cuda --first-step
"""

from __future__ import annotations

import argparse
import functools
import gc
import hmac
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
import blake3  # noqa: E402
import torch  # noqa: E402
from _lib import cli  # noqa: E402  (and this tree's src first on the path)
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

from nvtrain.private import make_private_dir  # noqa: E402
from nvtrain.worker import hostcopy, hostread, hoststaging, restore_ahead  # noqa: E402
from nvtrain.worker.hostcopy import (  # noqa: E402
    FORMAT,
    HostCopy,
    Layout,
    _hash,
    _keys,
    _leaves,
    _local,
    _map,
    check_hashes,
    verify_mac,
)
from nvtrain.worker.plain import load_plain  # noqa: E402

STEP, TOKEN = 10, "bench"


def parse_size(text: str) -> int:
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def model_of(size: int, width: int, device: str, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model + AdamW of about ``size`` bytes of state (no step taken yet)."""
    layers = max(1, round(size / (12 * width * width)))
    torch.manual_seed(seed)
    with torch.device(device):
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, width: int) -> None:
    device = next(model.parameters()).device
    x = torch.randn(16, width, device=device)
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optimizer)  # as the checkpointer's _state()
    return {"model": model_sd, "optim": optim_sd}


def tensors_of(state: Any) -> list[torch.Tensor]:
    return [_local(t) for _, t in _leaves(state)]


def digest_of(state: Any) -> str:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    for tensor in tensors_of(state):
        hasher.update(memoryview(tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy()))
    return hasher.hexdigest()


def seal(folder: Path, key: bytes, state: Any) -> None:
    """Stage and seal ``state`` as step 10's copy; the other slot's files are removed (room)."""
    copy = HostCopy(folder, run_id="bench", rank=0, world=1, key=key)
    copy.stage(state)
    slot = copy.last
    assert slot is not None
    copy.seal(slot, slot.generation, step=STEP, token=TOKEN, extra={"step": STEP, "rng": {}, "extra": {}})
    for other in copy.slots:
        other.close()
        if other is not slot:
            for path in (other.data, other.extra, other.header):
                path.unlink(missing_ok=True)


def two_pass(folder: Path, key: bytes, live: Any) -> dict[str, float]:
    """The restore as it was (c038217): ``find`` mapped and hashed the data, ``load`` read the
    extra again and copied each tensor out of the mapping."""
    times: dict[str, float] = {}
    cpu = time.process_time()
    t0 = time.perf_counter()
    copy = HostCopy(folder, run_id="bench", rank=0, world=1, key=key)
    layout = Layout.of(live)
    slot = next(s for s in copy.slots if (s.read_header() or {}).get("step") == STEP)
    header = slot.read_header()
    assert header is not None and header["format"] == FORMAT and verify_mac(header, key)
    t1 = time.perf_counter()
    times["header+MAC"] = t1 - t0
    slot.open(layout)  # O_RDWR|O_CREAT, posix_fallocate, mmap, views
    t2 = time.perf_counter()
    times["map"] = t2 - t1
    problem = check_hashes(slot, header, layout.nbytes, key)  # data (through the mapping) + extra
    assert not problem, problem
    t3 = time.perf_counter()
    times["hash"] = t3 - t2
    data = slot.extra.read_bytes()
    assert hmac.compare_digest(_hash(data, _keys(key)[0]), header["extra_hash"])
    rest = load_plain(data)
    t4 = time.perf_counter()
    times["extra"] = t4 - t3
    tensors = [t for _, t in _leaves(live)]
    assert sum(1 for _ in _leaves(rest["skeleton"])) == len(tensors) == len(slot.views)
    index = iter(range(len(tensors)))
    cuda = torch.cuda.is_available()

    def fill(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        i = next(index)
        _local(tensors[i]).copy_(slot.views[i], non_blocking=cuda)
        return tensors[i]

    _map(rest["skeleton"], fill)
    if cuda:
        torch.cuda.synchronize()
    times["copy"] = time.perf_counter() - t4
    slot.close()
    times["total"] = time.perf_counter() - t0
    times["cpu"] = time.process_time() - cpu
    return times


def one_pass(folder: Path, key: bytes, live: Any, **read: Any) -> dict[str, float]:
    """The restore as it is: ``HostCopy.find`` then ``load``."""
    times: dict[str, float] = {}
    cpu = time.process_time()
    t0 = time.perf_counter()
    copy = HostCopy(folder, run_id="bench", rank=0, world=1, key=key)
    slot, why = copy.find(step=STEP, token=TOKEN, state=live)
    assert slot is not None, why
    t1 = time.perf_counter()
    times["find"] = t1 - t0
    # --chunk, --readers, --hashers: passed on to hostread.read_checked, which load calls
    hostcopy.read_checked = functools.partial(hostread.read_checked, **read)
    try:
        copy.load(slot, live)
    finally:
        hostcopy.read_checked = hostread.read_checked
    times["load (read+hash)"] = time.perf_counter() - t1
    times["total"] = time.perf_counter() - t0
    times["cpu"] = time.process_time() - cpu
    return times


def machine_rates(nbytes: int) -> dict[str, float]:
    """GB/s of a plain copy (torch, 1 thread and all) and of the keyed hash (1 thread and all)."""
    size = min(nbytes, 1 << 30)
    src = torch.empty(size, dtype=torch.uint8).random_()
    dst = torch.empty_like(src).zero_()
    view = memoryview(src.numpy())
    key = os.urandom(32)
    rates = {}
    threads = torch.get_num_threads()

    def best(fn: Any) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return round(size / min(times) / 1e9, 2)

    torch.set_num_threads(1)
    rates["copy 1 thread"] = best(lambda: dst.copy_(src))
    torch.set_num_threads(threads)
    rates[f"copy {threads} threads"] = best(lambda: dst.copy_(src))
    rates["hash 1 thread"] = best(lambda: blake3.blake3(view, key=key).digest())
    rates["hash all threads"] = best(lambda: blake3.blake3(view, key=key, max_threads=-1).digest())
    return rates


def first_step(args: argparse.Namespace, folder: Path, key: bytes, kind: str) -> dict[str, Any]:
    """In a fresh process: build the model (``restore``: and restore the copy into it as the
    checkpointer does: find, load, set_state_dict; ``restore-ahead``: the same, its staging
    buffers made in the background from the process's start, as in a replacement worker;
    ``fresh``: no restore), then time --steps training steps."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--size", args.size,
         "--width", str(args.width), "--folder", str(folder), "--key", key.hex(), "--steps", str(args.steps),
         "--device", args.device],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def child(args: argparse.Namespace) -> None:
    result: dict[str, Any] = {}
    warming = None
    if args.child == "restore-ahead":  # as a replacement worker does at its start (``warm_restore``)
        torch.cuda.set_device(0)
        nbytes = restore_ahead.sealed_bytes(args.folder, 0)
        assert nbytes is not None, "no header of rank 0's in the folder"
        warming = hoststaging.warm(nbytes, hostread.CHUNK, hostread.threads()[0], 0)
        t_warm = time.perf_counter()
    model, optimizer = model_of(parse_size(args.size), args.width, args.device, seed=1)
    if warming is not None:  # (the restore waits for the rest, inside find_load_s)
        result["model_built_after_s"] = time.perf_counter() - t_warm
        result["staging_made_by_then"] = warming.is_set()
    if args.child in ("restore", "restore-ahead"):
        from torch.distributed.checkpoint.state_dict import _init_optim_state

        t = time.perf_counter()
        _init_optim_state(optimizer)  # what get_state_dict does first: a step at lr 0, for the state
        sync(args.device)
        t0 = time.perf_counter()
        result["init_optim_state_s"] = t0 - t
        live = state_of(model, optimizer)  # as the checkpointer's restore does
        t1 = time.perf_counter()
        copy = HostCopy(args.folder, run_id="bench", rank=0, world=1, key=bytes.fromhex(args.key))
        slot, why = copy.find(step=STEP, token=TOKEN, state=live)
        assert slot is not None, why
        state, _ = copy.load(slot, live)
        t2 = time.perf_counter()
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        sync(args.device)
        t3 = time.perf_counter()
        result.update(get_state_dict_s=t1 - t0, find_load_s=t2 - t1, set_state_dict_s=t3 - t2)
    steps = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        train_step(model, optimizer, args.width)
        steps.append(time.perf_counter() - t0)
    result["steps_s"] = steps
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="4G", help="state bytes: 200M, 4G (10^6, 10^9)")
    parser.add_argument(
        "--width", type=int, default=4096, help="Linear layers' width (smaller: more tensors)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--arms", default="two-pass,one-pass")
    parser.add_argument("--chunk", type=int, default=0, help="one-pass: bytes per chunk (0: hostread's)")
    parser.add_argument("--readers", type=int, default=0, help="one-pass: reader threads (0: hostread's)")
    parser.add_argument("--hashers", type=int, default=0, help="one-pass: hash threads (0: hostread's)")
    parser.add_argument("--first-step", action="store_true", help="also time training steps after a restore")
    parser.add_argument("--steps", type=int, default=6, help="training steps per process")
    parser.add_argument("--first-step-runs", type=int, default=3, help="processes of each kind")
    parser.add_argument("--device", default="cpu", help="where the live state is: cpu, cuda")
    parser.add_argument("--folder", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--key", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    folder = args.folder / f"nvtrain-bench-restore-{os.getpid()}"
    make_private_dir(folder, exist_ok=False)
    try:
        run(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(args: argparse.Namespace, folder: Path) -> None:
    key = os.urandom(32)
    t0 = time.perf_counter()
    model, optimizer = model_of(parse_size(args.size), args.width, args.device, seed=0)
    train_step(model, optimizer, args.width)  # (the optimizer has state)
    live = state_of(model, optimizer)
    nbytes = sum(t.numel() * t.element_size() for t in tensors_of(live))
    seal(folder, key, live)
    saved = digest_of(live)
    read = {k: v for k in ("chunk", "readers", "hashers") if (v := getattr(args, k))}
    readers, hashers = hostread.threads()
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "hostread": {"chunk": hostread.CHUNK, "readers": readers, "hashers": hashers, **read},
        "rates_gb_s": machine_rates(nbytes),
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"state: {nbytes / 1e9:.3f} GB in {len(tensors_of(live))} tensors (set up in "
          f"{time.perf_counter() - t0:.1f} s); {json.dumps(machine)}", flush=True)  # fmt: skip
    arms = args.arms.split(",")
    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    for repeat in range(args.repeats):
        for arm in arms:
            for tensor in tensors_of(live):
                tensor.zero_()
            if args.device == "cuda":
                torch.cuda.synchronize()
            gc.collect()  # (no collection owed by an earlier arm lands in this one)
            if arm == "two-pass":
                times = two_pass(folder, key, live)
            else:
                times = one_pass(folder, key, live, **read)
            if repeat == 0:
                assert digest_of(live) == saved, f"{arm}: the restored state is not the saved one"
            runs[arm].append(times)
            print(
                f"{arm} #{repeat + 1}: " + ", ".join(f"{k} {v:.3f} s" for k, v in times.items()), flush=True
            )
    results: dict[str, Any] = {"size": args.size, "bytes": nbytes, "machine": machine, "arms": {}}
    for arm, times in runs.items():
        medians = {k: statistics.median(t[k] for t in times) for k in times[0]}
        results["arms"][arm] = {"median_s": medians, "gb_s": nbytes / medians["total"] / 1e9, "runs": times}
    machine["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(summary(results))
    print(f"load average (1, 5, 15 min) before {machine['load_before']}, after {machine['load_after']}")
    if args.first_step:
        del live, model, optimizer
        kinds = {"restored": "restore", "fresh": "fresh"}
        if args.device == "cuda":  # (a CPU restore uses no page-locked buffers)
            kinds["restored, staging made ahead"] = "restore-ahead"
        found: dict[str, list[dict[str, Any]]] = {name: [] for name in kinds}
        for _ in range(args.first_step_runs):
            for name, kind in kinds.items():
                found[name].append(first_step(args, folder, key, kind))
        results["first_step"] = found
        print(first_step_summary(found))
    cli.write_json(args.json, results)


def summary(results: dict[str, Any]) -> str:
    lines = [
        f"| arm ({results['bytes'] / 1e9:.2f} GB) | parts, median s | total s | GB/s | CPU s |",
        "|---|---|---|---|---|",
    ]
    for arm, got in results["arms"].items():
        median = got["median_s"]
        parts = ", ".join(f"{k} {v:.3f}" for k, v in median.items() if k not in ("total", "cpu"))
        lines.append(f"| {arm} | {parts} | {median['total']:.3f} | {got['gb_s']:.2f} | {median['cpu']:.3f} |")
    arms = results["arms"]
    if "two-pass" in arms and "one-pass" in arms:
        ratio = arms["two-pass"]["median_s"]["total"] / arms["one-pass"]["median_s"]["total"]
        lines.append(f"one-pass is x{ratio:.2f} the speed of two-pass")
    return "\n".join(lines)


def first_step_summary(found: dict[str, list[dict[str, Any]]]) -> str:
    """Medians over the processes: the first step, the later steps' median, the restore's parts."""
    lines = []
    for name, runs in found.items():
        first = statistics.median(r["steps_s"][0] for r in runs)
        later = statistics.median(statistics.median(r["steps_s"][1:]) for r in runs)
        parts = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0] if k != "steps_s"}
        lines.append(
            f"{name} ({len(runs)} processes): first step {first:.3f} s, later steps {later:.3f} s "
            f"(x{first / later:.2f}){'; restore parts (s) ' + json.dumps(parts) if parts else ''}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()

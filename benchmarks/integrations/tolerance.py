"""How far a recovered run ends from a fault-free one, per framework (issue 38: the GPU tolerance
of an exact resume).

For each framework, three runs of ``bench_train.py --mode nvtrain`` under ``nvtrain run`` with
the same options as ``compare.py`` (the nvtrain arm): two without faults and one with
``--faults`` (an exception, a SIGKILL and a hang by default). Each ends by writing its final model
state (raw float32, rank 0) and the loss of that model on a fixed batch. Reported: the faulted
run against the first fault-free one, and the second fault-free run against the first (the
spread a job has without any fault): whether the states are equal bit for bit, the largest
absolute difference of a value, the relative L2 distance, and the difference of the final losses.

On CPU (gloo) every pair should be equal bit for bit (the integration tests assert it for small
models); on GPUs, nondeterministic kernels make even two fault-free runs differ, and the question
is whether a recovered run stays within that spread. ``--deterministic`` makes torch use
deterministic kernels (an op without one raises) with ``CUBLAS_WORKSPACE_CONFIG=:4096:8``.

    python benchmarks/integrations/tolerance.py --frameworks hf,lightning,accelerate --nproc 1 \\
        --steps 40 --save-every 10 --faults exception:12,sigkill:22,hang:32 --soft-timeout 5 \\
        --json tolerance-h200.json [--deterministic]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
sys.path.insert(0, str(Path(__file__).resolve().parent))  # compare.py
import compare  # noqa: E402
from _lib import cli  # noqa: E402


def distance(base: np.ndarray, other: np.ndarray) -> dict[str, Any]:
    """How far ``other`` is from ``base`` (the same model's flattened states)."""
    if base.shape != other.shape:
        return {"error": f"sizes differ: {base.size} and {other.size} values"}
    diff = np.abs(other.astype(np.float64) - base.astype(np.float64))
    norm = float(np.linalg.norm(base.astype(np.float64)))
    return {
        "bitwise_equal": bool(np.array_equal(base.view(np.uint32), other.view(np.uint32))),
        "max_abs_diff": float(diff.max()) if diff.size else 0.0,
        "relative_l2": float(np.linalg.norm(diff)) / norm if norm else math.nan,
        "values_differing": int(np.count_nonzero(diff)),
        "values": int(base.size),
    }


def one_framework(args: argparse.Namespace, framework: str, folder: Path) -> dict[str, Any]:
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} if args.deterministic else {}
    runs: dict[str, dict[str, Any]] = {}
    for name, faults in (("fault-free", ""), ("fault-free again", ""), ("faulted", args.faults)):
        final = folder / f"{framework}-{name.replace(' ', '-')}.f32"
        flags = (("--deterministic",) if args.deterministic else ()) + (
            ("--build-on-device",) if args.build_on_device else ()
        )
        extra = ("--final", str(final), *flags)
        result = compare.one_run(args, framework, "nvtrain", faults_text=faults, extra=extra, env_extra=env)
        result["state_file"] = str(final)
        runs[name] = result
        print(json.dumps({"run": name} | result), flush=True)
    out: dict[str, Any] = {"framework": framework, "runs": runs}
    files = {name: Path(r["state_file"]) for name, r in runs.items()}
    missing = [name for name, path in files.items() if not path.is_file()]
    if missing:
        out["error"] = f"no final state from: {', '.join(missing)}"
        return out
    base = np.fromfile(files["fault-free"], dtype=np.float32)
    loss0 = runs["fault-free"].get("final_loss")
    for name in ("fault-free again", "faulted"):
        other = np.fromfile(files[name], dtype=np.float32)
        loss = runs[name].get("final_loss")
        out[name] = distance(base, other) | {
            "loss_diff": None if loss is None or loss0 is None else abs(loss - loss0)
        }
    for path in files.values():
        path.unlink(missing_ok=True)
    return out


def main() -> None:
    parser = cli.parser(__doc__, part="all")
    compare.add_arguments(parser)
    parser.add_argument("--deterministic", action="store_true", help="deterministic kernels")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="integ-tolerance-") as tmp:
        for framework in args.frameworks.split(","):
            results.append(one_framework(args, framework, Path(tmp)))
    print("| framework | against the fault-free run | bitwise | max abs diff | relative L2 | loss diff |")
    print("|---|---|---|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['framework']} | {r['error']} | | | | |")
            continue
        for name in ("fault-free again", "faulted"):
            d = r[name]
            print(
                f"| {r['framework']} | {name} | {'yes' if d.get('bitwise_equal') else 'no'} | "
                f"{d.get('max_abs_diff', math.nan):.3g} | {d.get('relative_l2', math.nan):.3g} | "
                f"{d.get('loss_diff') if d.get('loss_diff') is None else format(d['loss_diff'], '.3g')} |"
            )
    options = vars(args) | {"json": str(args.json), "keep": str(args.keep)}
    cli.write_json(args.json, {"args": options, "results": results}, indent=1)


if __name__ == "__main__":
    main()

"""Cold-start time of the nvtrain command line.

Runs each command below as a fresh subprocess, N times, round-robin (round i runs every
command once before round i+1 starts, so a burst of noise hits all commands alike), and
reports median, p90 and min wall time, and each median as a multiple of the bare interpreter's
(``python -c pass``). One untimed warm-up round comes first (page cache, bytecode).

Each command is then run once more under ``python -X importtime`` to tell whether torch or
nvidia_resiliency_ext got imported, and the import time of ``nvtrain validate`` is split by
top-level package (median of several runs) to show where it goes.

    python benchmarks/startup.py                      # markdown to stdout
    python benchmarks/startup.py -n 50 --json out.json
    python benchmarks/startup.py --python .venv/bin/python

The target (issue: CLI start-up) is a median under 0.3 s for ``nvtrain validate`` and
``nvtrain --help`` on the CI machine (2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

TARGET_S = 0.3
TARGET_LABELS = ("nvtrain --help", "nvtrain validate")
HEAVY = {"torch": "torch", "nvidia_resiliency_ext": "NVRx"}

# A policy with a type error, an unknown key and a cross-field error: the path that reports.
INVALID_POLICY = """\
[job]
name = "bench"
script = "train.py"
nproc_per_node = 2

[rendezvous]
nodes = "2"

[heartbeat]
initial_timeout = "1m"
timeout = "5m"

[checkpoint]
intervall = 100
"""


@dataclasses.dataclass(frozen=True)
class Command:
    label: str
    args: list[str]
    """Arguments after the interpreter."""
    expect: int
    """Expected exit code (a different one means the benchmark measured the wrong thing)."""


@dataclasses.dataclass
class Result:
    command: Command
    samples: list[float] = dataclasses.field(default_factory=list)
    cpu: list[float] = dataclasses.field(default_factory=list)
    """CPU time (user + system) of each timed run: much less sensitive to a busy machine."""
    exit_codes: set[int] = dataclasses.field(default_factory=set)
    imports: dict[str, bool] = dataclasses.field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    @property
    def p90(self) -> float:
        ordered = sorted(self.samples)
        return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]  # nearest rank

    @property
    def min(self) -> float:
        return min(self.samples)


def commands(invalid: Path) -> list[Command]:
    return [
        Command("python -c pass", ["-c", "pass"], 0),
        Command("python -c 'import nvtrain'", ["-c", "import nvtrain"], 0),
        Command("nvtrain --help", ["-m", "nvtrain", "--help"], 0),
        Command("nvtrain validate", ["-m", "nvtrain", "validate"], 0),
        Command("nvtrain validate <invalid>", ["-m", "nvtrain", "validate", str(invalid)], 2),
        Command("nvtrain schema", ["-m", "nvtrain", "schema"], 0),
    ]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["COLUMNS"] = "80"
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(python: str, command: Command, cwd: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """Wall time, CPU time and exit code of one run."""
    cpu = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(
        [python, *command.args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - start, _children_cpu() - cpu, proc.returncode


def import_times(python: str, args: list[str], cwd: Path, env: dict[str, str]) -> dict[str, int]:
    """Self import time in microseconds per module, from one ``-X importtime`` run."""
    proc = subprocess.run(
        [python, "-X", "importtime", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    times: dict[str, int] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cumulative, name = line.removeprefix("import time:").split("|", 2)
        times[name.strip()] = times.get(name.strip(), 0) + int(self_us)
    return times


def heavy_imports(modules: dict[str, int]) -> dict[str, bool]:
    return {package: any(m == package or m.startswith(package + ".") for m in modules) for package in HEAVY}


def by_package(modules: dict[str, int]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for name, self_us in modules.items():
        totals[name.split(".")[0]] += self_us
    return dict(totals)


def top_entries(per_run: list[dict[str, int]], top: int) -> list[tuple[str, float, float]]:
    """(name, median ms, share of the median total) for the ``top`` largest entries."""
    names = {name for r in per_run for name in r}
    total_ms = statistics.median(sum(r.values()) for r in per_run) / 1000
    rows = []
    for name in names:
        ms = statistics.median(r.get(name, 0) / 1000 for r in per_run)
        rows.append((name, ms, ms / total_ms))
    rows.sort(key=lambda row: row[1], reverse=True)
    return rows[:top]


def machine(python: str) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": version,
        "platform": platform.platform(),
    }


def markdown(results: list[Result], baseline: float) -> str:
    lines = [
        "| command | median | p90 | min | median / `python -c pass` | CPU (median) | exit | torch | NVRx |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        codes = ",".join(str(c) for c in sorted(r.exit_codes))
        flags = ["yes" if r.imports.get(p) else "no" for p in HEAVY]
        lines.append(
            f"| `{r.command.label}` | {r.median:.3f} s | {r.p90:.3f} s | {r.min:.3f} s "
            f"| {r.median / baseline:.1f}x | {r.cpu_median:.3f} s | {codes} | {flags[0]} | {flags[1]} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--runs", type=int, default=20, help="timed runs per command (default 20)")
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter with nvtrain installed (default: this one)"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--top", type=int, default=5, help="import-time contributors of validate to list (default 5)"
    )
    parser.add_argument(
        "--importtime-runs", type=int, default=5, help="-X importtime runs to take the median of (default 5)"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    # The commands run in a temporary directory: a relative path (.venv/bin/python) must not
    # be resolved there.
    found = shutil.which(args.python)
    if found is None:
        parser.error(f"--python {args.python}: no such interpreter")
    args.python = os.path.abspath(found)

    env = child_env()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="nvtrain-startup-") as tmp:
        cwd = Path(tmp)
        invalid = cwd / "invalid.toml"
        invalid.write_text(INVALID_POLICY, encoding="utf-8")
        results = [Result(c) for c in commands(invalid)]

        for r in results:  # warm-up round, not timed; also checks each command does what we think
            _, _, code = run_once(args.python, r.command, cwd, env)
            if code != r.command.expect:
                print(
                    f"startup.py: `{r.command.label}` exited {code}, expected {r.command.expect}; "
                    f"is nvtrain installed for {args.python}?",
                    file=sys.stderr,
                )
                return 2
        for _ in range(args.runs):
            for r in results:
                seconds, cpu, code = run_once(args.python, r.command, cwd, env)
                r.samples.append(seconds)
                r.cpu.append(cpu)
                r.exit_codes.add(code)
        for r in results:
            r.imports = heavy_imports(import_times(args.python, r.command.args, cwd, env))
        validate = next(r for r in results if r.command.label == "nvtrain validate")
        profiles = [
            import_times(args.python, validate.command.args, cwd, env) for _ in range(args.importtime_runs)
        ]
        top_pkg = top_entries([by_package(p) for p in profiles], args.top)
        top_mod = top_entries(profiles, args.top)
        total_ms = statistics.median(sum(p.values()) for p in profiles) / 1000

    load_after = os.getloadavg()
    baseline = results[0].median
    info = machine(args.python)
    print(
        f"nvtrain start-up: {args.runs} runs per command, round-robin, after 1 warm-up round; "
        f"{info['nproc']} CPUs ({info['cpu']}), Python {info['python']}; 1-min load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after\n"
    )
    print(markdown(results, baseline))
    print()
    for label in TARGET_LABELS:
        r = next(r for r in results if r.command.label == label)
        verdict = "meets" if r.median < TARGET_S else "MISSES"
        print(f"- `{label}`: median {r.median:.3f} s {verdict} the {TARGET_S} s target")
    print(
        f"\nImport time of `nvtrain validate`: {total_ms:.0f} ms in all (sum of self times, median of "
        f"{args.importtime_runs} `-X importtime` runs). Largest contributors:\n"
    )
    for what, rows in (("top-level package (self times summed)", top_pkg), ("module (self time)", top_mod)):
        print(f"| {what} | import time | share |")
        print("|---|---:|---:|")
        for name, ms, share in rows:
            print(f"| `{name}` | {ms:.1f} ms | {share:.0%} |")
        print()

    if args.json is not None:
        data = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": info,
            "interpreter": args.python,
            "runs": args.runs,
            "target_s": TARGET_S,
            "load_average_1min": {"before": load_before[0], "after": load_after[0]},
            "baseline_median_s": baseline,
            "commands": [
                {
                    "label": r.command.label,
                    "argv": [args.python, *r.command.args],
                    "exit_codes": sorted(r.exit_codes),
                    "median_s": r.median,
                    "p90_s": r.p90,
                    "min_s": r.min,
                    "cpu_median_s": r.cpu_median,
                    "ratio_to_baseline": r.median / baseline,
                    "imports": {HEAVY[p]: r.imports.get(p, False) for p in HEAVY},
                    "samples_s": r.samples,
                    "cpu_samples_s": r.cpu,
                }
                for r in results
            ],
            "validate_import_ms": total_ms,
            "validate_import_top_packages": [{"name": n, "ms": ms, "share": s} for n, ms, s in top_pkg],
            "validate_import_top_modules": [{"name": n, "ms": ms, "share": s} for n, ms, s in top_mod],
        }
        args.json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

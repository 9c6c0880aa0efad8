"""Recovery after SIGKILL and start-up overhead: `nvtrain run` against its alternatives.

Part 1 runs ``worker.py`` (2 gloo ranks; rank 1 SIGKILLs itself at K steps, each fault once
per run) under two launchers, alternating, R times each:

* ``nvtrain``: ``nvtrain run policy.toml`` (in-process restart off, in-job ``max_restarts = K``;
  no ``warm_start`` key: the default, warm; ``--cold`` adds ``nvtrain-cold``, ``warm_start = false``);
* ``torchrun``: ``torchrun --nproc-per-node=2 --max-restarts=K --monitor-interval=<same>
  --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:<port> worker.py ...``.

Recovery time of a fault = time of the first step completed by the restarted workers minus
the time of the fault, both taken by the workers with ``time.time()``. It is split into
fault -> first restarted worker process started (detection, teardown, rendezvous, spawn) and
that start -> first completed step (interpreter and torch imports, process group, model).

Part 2 starts the same worker without faults, N times each, alternating, under ``nvtrain run``
and under ``python -m nvidia_resiliency_ext.fault_tolerance.launcher`` with the argv and
environment that ``nvtrain run --dry-run`` prints, and reports the time from process start to
the first completed step and from the last step to the launcher's exit.

    python benchmarks/recovery/sigkill.py                       # K=5 faults, R=2, N=5
    python benchmarks/recovery/sigkill.py --faults 5 --repeats 2 --json out.json

Every launcher runs in a session of its own; the driver makes itself a child subreaper, so
whatever a run leaves behind is re-parented here, counted ("leftovers") and killed by pid.

torchrun's c10d rendezvous hands its own TCPStore to the workers by default (torch >= 2.5),
and here (torch 2.13, gloo) a restarted group then sometimes failed in ``init_process_group``
("Gloo connectFullMesh failed ... Connection refused", cf. pytorch/pytorch#135712), ending the
torchrun run with exit 1. NVRx 0.4.1's agent gives each worker group a store of its own, hosted
by rank 0. So that both arms work the same way, the driver sets
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` for every arm; ``--shared-store`` keeps torch's default.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib import cli, host, procs  # noqa: E402
from _lib.stats import fmt, median, percentile, span  # noqa: E402

from nvtrain.events import read_events  # noqa: E402
from nvtrain.events.records import LauncherStarted  # noqa: E402
from nvtrain.launcher.process import become_subreaper, descendants, kill_all  # noqa: E402
from nvtrain.runlog import pod_files  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"

_EVENT = re.compile(
    r"BENCH (?P<kind>start|built|ready|step|fault|done) rank=(?P<rank>\d+) pid=(?P<pid>\d+) "
    r"restart=(?P<restart>\S+) ts=(?P<ts>\d+\.\d+)(?: step=(?P<step>\d+))?"
)


# --------------------------------------------------------------------------- processes


def _kill_descendants() -> list[int]:
    """SIGKILL every descendant of this process (the library's kill_all, no grace); returns
    the pids that were still there."""
    pids = [p.pid for p in descendants()]
    kill_all(timeout=0.0)
    return pids


# --------------------------------------------------------------------------- one run


@dataclasses.dataclass
class Run:
    arm: str
    index: int
    argv: list[str]
    log: Path
    start: float = 0.0
    """Wall clock just before the launcher process was created."""
    end: float = 0.0
    """Wall clock when the launcher process had exited."""
    exit_code: int | None = None
    timed_out: bool = False
    loadavg: float = 0.0
    """1-minute load average when the run started (other tenants of the machine show here)."""
    leftovers: int = 0
    """Descendants still alive 2 s after the launcher exited (then killed)."""
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    marks: dict[str, float] = dataclasses.field(default_factory=dict)
    """Wall-clock times of launcher milestones: ``nvtrain_spawned`` (nvtrain's events log) and
    ``agent_exit`` (ft_launcher's "Agent exits" log line)."""

    def steps(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == "step"]


def _parse(text: str) -> list[dict[str, Any]]:
    events = []
    for m in _EVENT.finditer(text):
        events.append(
            {
                "kind": m["kind"],
                "rank": int(m["rank"]),
                "pid": int(m["pid"]),
                "restart": m["restart"],
                "ts": float(m["ts"]),
                "step": int(m["step"]) if m["step"] else None,
            }
        )
    events.sort(key=lambda e: e["ts"])
    return events


_AGENT_EXIT = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[\w+\] \[ft_launcher\d+@[^\]]*\] Agent exits"
)


def _marks(text: str, rundir: Path) -> dict[str, float]:
    marks = {}
    m = _AGENT_EXIT.search(text)
    if m:  # logging's asctime: local time, milliseconds
        marks["agent_exit"] = datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    started = [
        e.ts
        for run_dir in sorted(rundir.glob("checkpoints/*"))
        for path in pod_files(run_dir)  # one log per pod: events-node<N>.jsonl
        for e in read_events(path)
        if isinstance(e, LauncherStarted)
    ]
    if started:  # the first start of ft_launcher (a relaunch starts it again)
        marks["nvtrain_spawned"] = min(started)
    return marks


def execute(run: Run, env: dict[str, str], timeout: float) -> Run:
    """Run one launcher to completion (or ``timeout``), then clean up after it."""
    run.loadavg = os.getloadavg()[0]
    finished = procs.run_job(run.argv, run.log, timeout, env=env, cwd=run.log.parent)
    run.start, run.end = finished.start, finished.end
    run.exit_code, run.timed_out = finished.exit_code, finished.timed_out
    psutil.wait_procs(descendants(), timeout=2.0)  # what exits by itself (reaped) is no leftover
    run.leftovers = len(_kill_descendants())
    text = run.log.read_text(errors="replace")
    run.events = _parse(text)
    run.marks = _marks(text, run.log.parent)
    return run


# --------------------------------------------------------------------------- analysis


PHASES = (
    ("respawn_s", "fault→respawn"),
    ("build_s", "respawn→built"),
    ("join_s", "built→first step"),
)
"""How a recovery splits: the launcher notices the dead rank, stops the group and starts a new
one (respawn); the new workers import torch and build the model, local CPU work (built); they
form the process group, agree on the step and complete it (first step)."""


def recoveries(run: Run) -> list[dict[str, Any]]:
    """Per fault: recovery time and its phases (``PHASES``), in seconds."""
    out = []
    for fault in (e for e in run.events if e["kind"] == "fault"):
        old_pids = {e["pid"] for e in run.events if e["ts"] <= fault["ts"]}
        after = [e for e in run.events if e["ts"] > fault["ts"] and e["pid"] not in old_pids]
        step = next((e for e in after if e["kind"] == "step"), None)
        group = [e for e in after if step is None or e["ts"] <= step["ts"]]
        starts = [e["ts"] for e in group if e["kind"] == "start"]
        built = [e["ts"] for e in group if e["kind"] == "built"]
        row: dict[str, Any] = {"step": fault["step"], "fault_ts": fault["ts"]}
        row["recovery_s"] = step["ts"] - fault["ts"] if step else None
        row["respawn_s"] = min(starts) - fault["ts"] if starts else None
        row["build_s"] = max(built) - min(starts) if starts and built else None
        row["join_s"] = step["ts"] - max(built) if step and built else None
        row["resumed_at"] = step["step"] if step else None
        out.append(row)
    return out


# --------------------------------------------------------------------------- arms


def write_policy(
    path: Path, *, port: int, worker_args: list[str], faults: int, monitor: float, warm: bool | None = None
) -> None:
    args = ", ".join(json.dumps(a) for a in worker_args)
    path.write_text(
        f"""\
# Written by benchmarks/recovery/sigkill.py.
[job]
name = "recovery-bench"
script = {json.dumps(str(WORKER))}
args = [{args}]
nproc_per_node = 2
collective_timeout = "60s"
{"" if warm is None else f"warm_start = {str(warm).lower()}"}

[rendezvous]
nodes = 1
port = {port}
join_timeout = "60s"

[heartbeat]
initial_timeout = "300s"
timeout = "120s"
monitor_interval = {monitor}

[restart]
escalate_after = {faults + 1}

[restart.in_process]
enabled = false

[restart.in_job]
max_restarts = {faults}

[checkpoint]
dir = {json.dumps(str(path.parent / "checkpoints"))}
interval = 20
""",
        encoding="utf-8",
    )


def worker_args(state: Path, steps: int, step_time: float, fault_steps: list[int]) -> list[str]:
    args = ["--steps", str(steps), "--step-time", str(step_time), "--state-dir", str(state)]
    if fault_steps:
        args += ["--faults", ",".join(map(str, fault_steps))]
    return args


def recovery_run(arm: str, index: int, root: Path, opts: argparse.Namespace, fault_steps: list[int]) -> Run:
    rundir = root / f"recovery-{arm}-{index}"
    rundir.mkdir(parents=True)
    wargs = worker_args(rundir / "state", opts.steps, opts.step_time, fault_steps)
    port = procs.free_port()
    k = len(fault_steps)
    if arm.startswith("nvtrain"):
        policy = rundir / "policy.toml"
        write_policy(
            policy,
            port=port,
            worker_args=wargs,
            faults=k,
            monitor=opts.monitor_interval,
            warm=False if arm == "nvtrain-cold" else None,
        )
        argv = [*procs.tool("nvtrain", "nvtrain"), "run", str(policy)]
    else:
        argv = [
            *procs.tool("torchrun", "torch.distributed.run"),
            "--nproc-per-node=2",
            f"--max-restarts={k}",
            f"--monitor-interval={opts.monitor_interval:g}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            str(WORKER),
            *wargs,
        ]
    return execute(Run(arm, index, argv, rundir / "log.txt"), opts.env, opts.timeout)


def startup_run(arm: str, index: int, root: Path, opts: argparse.Namespace) -> Run:
    rundir = root / f"startup-{arm}-{index}"
    rundir.mkdir(parents=True)
    wargs = worker_args(rundir / "state", opts.startup_steps, opts.step_time, [])
    policy = rundir / "policy.toml"
    write_policy(policy, port=procs.free_port(), worker_args=wargs, faults=1, monitor=opts.monitor_interval)
    nvtrain = [*procs.tool("nvtrain", "nvtrain"), "run"]
    env = opts.env
    if arm == "nvtrain":
        argv = [*nvtrain, str(policy)]
    else:
        # The plan nvtrain would run (not timed): same argv, same extra environment. `--dry-run`
        # must come before the policy: everything after it goes to the training script.
        plan = json.loads(
            subprocess.run(
                [*nvtrain, "--dry-run", str(policy)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                cwd=rundir,
            ).stdout
        )
        (rundir / "plan.json").write_text(json.dumps(plan, indent=2))
        # The plan names NVRx's config file in the state folder `nvtrain run` would make; a
        # dry run makes none, so the arm writes the same file (from the same policy) itself.
        from nvtrain.config import load_policy
        from nvtrain.launcher.plan import ft_config_text

        config = rundir / "ft_config.yaml"
        config.write_text(ft_config_text(load_policy(policy).heartbeat), encoding="utf-8")
        argv = [f"--ft-cfg-path={config}" if a.startswith("--ft-cfg-path=") else a for a in plan["argv"]]
        env = {**env, **plan["env"]}
    return execute(Run(arm, index, argv, rundir / "log.txt"), env, opts.timeout)


# --------------------------------------------------------------------------- report


def recovery_report(runs: list[Run], arms: list[str], fault_steps: list[int], steps: int) -> tuple[str, dict]:
    phase_cols = " | ".join(f"{label} median" for _, label in PHASES)
    lines = [
        "Seconds. Recovery = first step completed by the restarted workers − the fault.",
        "",
        "| arm | runs | exit codes | faults fired | all steps done | leftovers | recovery per fault "
        f"| **median** | p95 | max | {phase_cols} | wall per run |",
        "|" + "---|" * (10 + len(PHASES) + 1),
    ]
    summary: dict[str, Any] = {}
    for arm in arms:
        mine = [r for r in runs if r.arm == arm]
        rows = [row for r in mine for row in recoveries(r)]
        rec = [v for row in rows if (v := row["recovery_s"]) is not None]
        fired = sum(1 for r in mine for e in r.events if e["kind"] == "fault")
        complete = [{e["step"] for e in r.steps()} >= set(range(1, steps + 1)) for r in mine]
        summary[arm] = {
            "runs": len(mine),
            "exit_codes": [r.exit_code for r in mine],
            "all_exit_0": all(r.exit_code == 0 for r in mine),
            "all_steps_completed": all(complete),
            "faults_fired": fired,
            "faults_expected": len(fault_steps) * len(mine),
            "recovery_s": rec,
            "median_s": median(rec),
            "p95_s": percentile(rec, 95) if rec else None,
            "max_s": max(rec) if rec else None,
            "phase_median_s": {
                key: median([v for row in rows if (v := row[key]) is not None]) for key, _ in PHASES
            },
            "wall_s": [round(r.end - r.start, 2) for r in mine],
            "leftovers": [r.leftovers for r in mine],
            "steps_redone": [len(r.steps()) - len({e["step"] for e in r.steps()}) for r in mine],
            "faults": [{"run": r.index, **row} for r in mine for row in recoveries(r)],
        }
        s = summary[arm]
        phases = " | ".join(fmt(s["phase_median_s"][key]) for key, _ in PHASES)
        lines.append(
            f"| {arm} | {len(mine)} | {', '.join(map(str, s['exit_codes']))} "
            f"| {fired}/{s['faults_expected']} | {'yes' if all(complete) else 'no'} | {sum(s['leftovers'])} "
            f"| {' '.join(fmt(v) for v in rec)} | **{fmt(s['median_s'])}** | {fmt(s['p95_s'])} "
            f"| {fmt(s['max_s'])} | {phases} | {', '.join(f'{w:.1f}' for w in s['wall_s'])} |"
        )
    lines.append("")
    base = arms[-1]  # torchrun: every other arm is compared with it
    for arm in arms[:-1]:
        suffix = "" if arm == "nvtrain" else f"_{arm}"
        for key, label in (("recovery_s", "recovery"), *PHASES):
            a, b = (
                summary[x]["median_s"] if key == "recovery_s" else summary[x]["phase_median_s"][key]
                for x in (arm, base)
            )
            ratio = a / b if a is not None and b else None
            summary[("ratio_median" if key == "recovery_s" else f"ratio_median_{key}") + suffix] = ratio
            lines.append(
                f"- median {label}: {arm} {fmt(a)} s, {base} {fmt(b)} s, ratio {arm}/{base} {fmt(ratio, 3)}"
            )
    lines.append("")
    labels = " | ".join(label for _, label in PHASES)
    lines.append(f"| run | arm | fault step | {labels} | recovery | resumed at step |")
    lines.append("|" + "---|" * (5 + len(PHASES)))
    for r in sorted(runs, key=lambda r: r.start):
        for row in recoveries(r):
            cells = " | ".join(fmt(row[key]) for key, _ in PHASES)
            lines.append(
                f"| {r.index} | {r.arm} | {row['step']} | {cells} | {fmt(row['recovery_s'])} "
                f"| {row['resumed_at']} |"
            )
    lines.append("")
    lines.append("| run | arm | exit code | wall (s) | load average at start | leftovers |")
    lines.append("|---|---|---|---|---|---|")
    for r in sorted(runs, key=lambda r: r.start):
        lines.append(
            f"| {r.index} | {r.arm} | {r.exit_code}{' (timed out)' if r.timed_out else ''} "
            f"| {r.end - r.start:.1f} | {r.loadavg:.2f} | {r.leftovers} |"
        )
    return "\n".join(lines), summary


def startup_report(runs: list[Run], arms: list[str]) -> tuple[str, dict]:
    """Medians (min–max) of start-up and exit phases, per arm."""

    def phases(r: Run) -> dict[str, float | None]:
        steps, starts = r.steps(), [e["ts"] for e in r.events if e["kind"] == "start"]
        built = [e["ts"] for e in r.events if e["kind"] == "built"]
        first, last = (steps[0]["ts"], steps[-1]["ts"]) if steps else (None, None)
        spawn = min(starts) if starts else None
        ready = max(built) if built else None
        agent, nvt = r.marks.get("agent_exit"), r.marks.get("nvtrain_spawned")

        def d(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else b - a

        return {
            "to_launcher": d(r.start, nvt),
            "to_workers": d(r.start, spawn),
            "workers_to_built": d(spawn, ready),
            "built_to_step": d(ready, first),
            "to_first_step": d(r.start, first),
            "step_to_agent_exit": d(last, agent),
            "agent_exit_to_end": d(agent, r.end),
            "step_to_end": d(last, r.end),
            "wall": r.end - r.start,
        }

    columns = [
        ("to_launcher", "start→ft_launcher spawned"),
        ("to_workers", "start→workers started"),
        ("workers_to_built", "workers started→built"),
        ("built_to_step", "built→first step"),
        ("to_first_step", "**start→first step**"),
        ("step_to_agent_exit", "last step→agent exit log"),
        ("agent_exit_to_end", "agent exit log→process exit"),
        ("step_to_end", "**last step→exit**"),
        ("wall", "wall"),
    ]
    summary: dict[str, Any] = {}
    header = "| arm | reps | exit codes | leftovers | " + " | ".join(label for _, label in columns) + " |"
    lines = [
        "Seconds, median (min–max).",
        "",
        header,
        "|" + "---|" * (4 + len(columns)),
    ]
    for arm in arms:
        mine = [r for r in runs if r.arm == arm]
        per_run = [phases(r) for r in mine]
        values: dict[str, list[float]] = {
            key: [v for p in per_run if (v := p[key]) is not None] for key, _ in columns
        }
        summary[arm] = {
            "exit_codes": [r.exit_code for r in mine],
            "all_exit_0": all(r.exit_code == 0 for r in mine),
            "leftovers": [r.leftovers for r in mine],
            "runs": per_run,
            "median_s": {key: median(v) for key, v in values.items()},
        }

        cells = " | ".join(span(values[key]) for key, _ in columns)
        lines.append(
            f"| {arm} | {len(mine)} | {', '.join(map(str, summary[arm]['exit_codes']))} "
            f"| {sum(summary[arm]['leftovers'])} | {cells} |"
        )
    lines.append("")
    for key, label in (("to_first_step", "start→first step"), ("step_to_end", "last step→exit")):
        a, b = (summary[arm]["median_s"][key] for arm in arms)
        if a is not None and b:
            summary[f"{key}_diff_s"], summary[f"{key}_ratio"] = a - b, a / b
            lines.append(f"Median {label}: {arms[0]} − {arms[1]} = {a - b:+.2f} s, ratio {a / b:.3f}")
    lines.append("")
    lines.append("| run | arm | exit code | load average at start | start→first step | last step→exit |")
    lines.append("|---|---|---|---|---|---|")
    for r in sorted(runs, key=lambda r: r.start):
        p = phases(r)
        lines.append(
            f"| {r.index} | {r.arm} | {r.exit_code}{' (timed out)' if r.timed_out else ''} | {r.loadavg:.2f} "
            f"| {fmt(p['to_first_step'])} | {fmt(p['step_to_end'])} |"
        )
    return "\n".join(lines), summary


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--faults", type=int, default=5, help="SIGKILLs per run (K)")
    parser.add_argument("--repeats", type=int, default=2, help="recovery runs per arm (R)")
    parser.add_argument("--steps", type=int, default=120, help="steps per recovery run")
    parser.add_argument("--step-time", type=float, default=0.05, help="sleep per step (s)")
    parser.add_argument("--monitor-interval", type=float, default=0.5, help="launchers' monitor interval (s)")
    parser.add_argument("--startup-reps", type=int, default=5, help="start-up runs per arm (N); 0 skips")
    parser.add_argument("--startup-steps", type=int, default=20, help="steps per start-up run")
    parser.add_argument("--timeout", type=float, default=240.0, help="limit per run (s)")
    parser.add_argument("--shared-store", action="store_true", help="keep torch's shared rendezvous store")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument(
        "--cold", action="store_true", help="add the arm nvtrain-cold: `nvtrain run` with warm_start = false"
    )
    parser.add_argument("--keep", type=Path, help="keep logs and policies in this directory")
    opts = parser.parse_args(argv)
    if opts.faults < 1 or opts.faults >= opts.steps:
        parser.error("--faults must be between 1 and --steps - 1")
    if opts.repeats < 1:
        parser.error("--repeats must be at least 1")

    fault_steps = [opts.steps * (i + 1) // (opts.faults + 1) for i in range(opts.faults)]
    root = Path(tempfile.mkdtemp(prefix="nvtrain-recovery-")) if opts.keep is None else opts.keep
    root.mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVTRAIN_", "TORCHELASTIC_"))}
    env["TMPDIR"] = str(root / "tmp")  # launchers' scratch (sockets, logs, nvtrain state) stays here
    env["PYTHONWARNINGS"] = "ignore::FutureWarning"
    if not opts.shared_store:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    opts.env = env

    become_subreaper()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    info = host.machine()
    started = time.monotonic()
    recovery: list[Run] = []
    startup: list[Run] = []
    arms = ["nvtrain", *(["nvtrain-cold"] if opts.cold else []), "torchrun"]
    try:
        for i in range(opts.repeats):
            for arm in arms if i % 2 == 0 else arms[::-1]:
                run = recovery_run(arm, i, root, opts, fault_steps)
                recovery.append(run)
                print(
                    f"recovery {arm} #{i}: exit {run.exit_code}, {run.end - run.start:.1f} s, "
                    f"load {run.loadavg:.2f}",
                    file=sys.stderr,
                    flush=True,
                )
        s_arms = ["nvtrain", "ft_launcher"]
        for i in range(opts.startup_reps):
            for arm in s_arms if i % 2 == 0 else s_arms[::-1]:
                run = startup_run(arm, i, root, opts)
                startup.append(run)
                print(
                    f"startup {arm} #{i}: exit {run.exit_code}, {run.end - run.start:.1f} s, "
                    f"load {run.loadavg:.2f}",
                    file=sys.stderr,
                    flush=True,
                )
    except BaseException:
        print(f"interrupted; logs are in {root}", file=sys.stderr)
        raise
    finally:
        _kill_descendants()
    info["loadavg_end"] = os.getloadavg()
    info["total_s"] = round(time.monotonic() - started, 1)

    cmd = shlex.join([Path(sys.executable).as_posix(), *sys.argv])
    rec_text, rec_summary = recovery_report(recovery, arms, fault_steps, opts.steps)
    out = [
        f"Command: `{cmd}`",
        "",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), Python {info['python']}, torch {info['torch']}, "
        f"NVRx {info['nvidia-resiliency-ext']}, nvtrain {info['nvtrain']} ({info['nvtrain_git']}); "
        f"{info['date']}; load average {info['loadavg_start'][0]:.2f} at start, "
        f"{info['loadavg_end'][0]:.2f} at end; {info['total_s']} s in all.",
        "",
        f"## Recovery after SIGKILL ({opts.faults} faults of rank 1 at steps "
        f"{', '.join(map(str, fault_steps))} of {opts.steps}; {opts.repeats} run(s) per arm, alternating; "
        f"monitor interval {opts.monitor_interval:g} s; "
        f"TORCH_DISABLE_SHARE_RDZV_TCP_STORE={'unset' if opts.shared_store else '1'})",
        "",
        rec_text,
    ]
    st_summary: dict[str, Any] = {}
    if startup:
        st_text, st_summary = startup_report(startup, ["nvtrain", "ft_launcher"])
        out += [
            "",
            f"## Start-up and exit, no faults ({opts.startup_steps} steps, "
            f"{opts.startup_reps} run(s) per arm, alternating)",
            "",
            st_text,
        ]
    print("\n".join(out))
    if opts.json:
        data = {
            "command": cmd,
            "machine": info,
            "options": {k: v for k, v in vars(opts).items() if k != "env" and not isinstance(v, Path)},
            "fault_steps": fault_steps,
            "recovery": rec_summary,
            "startup": st_summary,
            "runs": [
                {k: v for k, v in dataclasses.asdict(r).items() if k != "events"} | {"log": str(r.log)}
                for r in recovery + startup
            ],
        }
        opts.json.write_text(json.dumps(data, indent=2, default=str))
    if opts.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    ok = all(r.exit_code == 0 for r in recovery + startup)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

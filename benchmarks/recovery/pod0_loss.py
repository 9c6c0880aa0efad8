"""Losing pod 0 (the rendezvous store's host) mid-run: does a 2-node job recover, and how fast?

Emulates a 2-pod Indexed Job on one machine without network namespaces: each pod is one
``python -m nvtrain run POLICY --run-id ID`` in a session of its own, with
``JOB_COMPLETION_INDEX=<i>``, ``POD_IP=127.0.0.<i+1>`` (all of 127/8 is loopback) and the pods'
stable names ``pod0loss-<i>.pod0loss.default.svc.nvtrain.test`` mapped to those addresses in
/etc/hosts. The job is the CPU demo (gloo, 1 rank per pod, async checkpoints every 10 steps to
one shared directory). When the events log shows step >= K, every process of the victim pod
(tagged with its own ``POD_LOSS_TOKEN``) is SIGKILLed; ``--down`` s later the pod starts again
with the same run id and environment. The driver waits for both pods to exit and reports exit
codes, the last step, the time from the kill to the first step after it, and the checkpoint
step resumed from.

    # as root on a disposable machine: append the names to /etc/hosts (restored at the end)
    python3 benchmarks/recovery/pod0_loss.py --write-hosts --out /tmp/p0 --json /tmp/p0/r.json
    python3 benchmarks/recovery/pod0_loss.py --write-hosts --kill-pod 1 --out /tmp/p1
    # NVRx 0.6+: the store in a third pod running `nvtrain control` (127.0.0.3, pod0loss-control)
    python3 benchmarks/recovery/pod0_loss.py --write-hosts --store control --out /tmp/pc
    # NVRx 0.6+ hot spare: 3 pods, 2 train, pod 0 lost for good
    python3 benchmarks/recovery/pod0_loss.py --write-hosts --nodes 3 --min-nodes 2 --down -1 --store control
    PYTHONPATH=<NVRx 0.7.0 dir> python3 benchmarks/recovery/pod0_loss.py --write-hosts --in-process
    # elsewhere: each pod gets a private /etc/hosts (unshare --mount + bind mount)
    .venv/bin/python benchmarks/recovery/pod0_loss.py --out /tmp/p0

Pod logs are left in ``--out`` (``pod<i>-<incarnation>.log``, plus each pod's events log
``ckpt/<run id>/events-node<N>.jsonl``).
Exit status: 0 when every pod's last process exited 0, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _lib
from _lib.procs import free_port  # noqa: E402
from _lib.runs import run_events as read_events  # noqa: E402

from nvtrain.events.records import CheckpointRestored, DnsWait, Event, LauncherStarted, Step  # noqa: E402

JOB, DOMAIN = "pod0loss", "nvtrain.test"
CONTROL = "control"
ADDRESSES: dict[int | str, str] = {0: "127.0.0.1", 1: "127.0.0.2", CONTROL: "127.0.0.3", 2: "127.0.0.4"}
TOKEN_VAR = "POD_LOSS_TOKEN"
_DROPPED: tuple[str, ...] = ("TORCHELASTIC_", "NVTRAIN_", "PET_", "RANK", "WORLD_SIZE", "LOCAL_RANK")
_DROPPED += ("MASTER_", "JOB_COMPLETION_INDEX", "POD_IP", "HOSTNAME")


def pod_name(index: int | str) -> str:
    return f"{JOB}-{index}.{JOB}.default.svc.{DOMAIN}"


def policy_toml(args: argparse.Namespace, ckpt: Path) -> str:
    demo = ["--steps", str(args.steps), "--step-time", str(args.step_time), "--log-every", "10"]
    in_process = (
        'enabled = true\nsoft_timeout = "10s"\nhard_timeout = "20s"' if args.in_process else "enabled = false"
    )
    return f"""\
[job]
name = "{JOB}"
module = "nvtrain.demo"
args = {json.dumps(demo)}
nproc_per_node = 1
max_steps = {args.steps}
backend = "gloo"
stop_timeout = "10s"
collective_timeout = "8s"

[rendezvous]
nodes = {args.nodes}
min_nodes = {args.min_nodes or args.nodes}
cluster_domain = "{DOMAIN}"
port = {free_port()}
dns_timeout = "60s"
join_timeout = "120s"
store = "{args.store}"

[heartbeat]
initial_timeout = "60s"
timeout = "30s"
monitor_interval = "1s"

[restart.in_process]
{in_process}

[restart.in_job]
max_restarts = {args.max_restarts}

[checkpoint]
dir = "{ckpt}"
interval = 10
async = true
keep = 3
"""


def hosts_lines() -> str:
    return "".join(f"{addr} {pod_name(i)}\n" for i, addr in ADDRESSES.items())


def resolves() -> bool:
    with contextlib.suppress(OSError):
        return all(
            {str(a[4][0]) for a in socket.getaddrinfo(pod_name(i), None, proto=socket.IPPROTO_TCP)} == {addr}
            for i, addr in ADDRESSES.items()
        )
    return False


def private_hosts_prefix(out: Path) -> list[str]:
    """A command prefix giving its command a private /etc/hosts (mount namespace + bind mount)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        sys.exit("pod0_loss: no unshare/mount here; run as root with --write-hosts instead")
    hosts = out / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text(encoding="utf-8").rstrip("\n") + "\n" + hosts_lines())
    userns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    prefix = ["unshare", *userns, "--mount", "--propagation", "private", "--"]
    prefix += ["sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts)]
    probe = subprocess.run(
        [*prefix, "getent", "hosts", pod_name(1)], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0 or ADDRESSES[1] not in probe.stdout:
        sys.exit(f"pod0_loss: no private /etc/hosts for the pods ({probe.stderr.strip()}); use --write-hosts")
    return prefix


class Pod:
    """One incarnation of a pod: an ``nvtrain run`` process and everything carrying its token."""

    def __init__(self, index: int | str, incarnation: int, argv: list[str], out: Path, tmp: Path) -> None:
        self.index, self.token = index, uuid.uuid4().hex
        self.log = out / f"pod{index}-{incarnation}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
        (tmp / f"pod{index}").mkdir(exist_ok=True)  # a pod's own /tmp (ft_launcher's sockets)
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU only: the workers pick CUDA whenever they see it
        env.update(POD_IP=ADDRESSES[index], HOSTNAME=f"{JOB}-{index}")
        if index != CONTROL:
            env["JOB_COMPLETION_INDEX"] = str(index)
        env.update({TOKEN_VAR: self.token, "TMPDIR": str(tmp / f"pod{index}"), "PYTHONUNBUFFERED": "1"})
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def processes(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.environ().get(TOKEN_VAR) == self.token and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        return found

    def kill(self) -> int:
        """SIGKILL every process of this pod until none is left; returns how many were killed."""
        killed: set[int] = set()
        for _ in range(50):
            procs = self.processes()
            if not procs:
                break
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
                    killed.add(proc.pid)
            psutil.wait_procs(procs, timeout=2.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return len(killed)

    def tail(self, lines: int) -> list[str]:
        return self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]


def last_step(events: list[Event]) -> int:
    return max((e.step for e in events if isinstance(e, Step) and e.step is not None), default=0)


def launcher_row(event: Event, killed_at: float) -> dict[str, Any]:
    """A launcher event after the kill: when (s after it), which node, what, and its details."""
    fields = event.fields()
    details = {
        k: fields[k] for k in ("error", "message", "exit_code", "cause", "nodes", "round") if k in fields
    }
    return {"t": round(event.ts - killed_at, 1), "node": event.node, "event": event.name} | details


def wait_until(what: str, deadline: float, check: Any) -> bool:
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    print(f"pod0_loss: gave up waiting for {what}", file=sys.stderr)
    return False


def run(args: argparse.Namespace, out: Path, tmp: Path, prefix: list[str]) -> dict[str, Any]:
    run_id = f"{JOB}-{uuid.uuid4().hex[:8]}"
    policy = out / "policy.toml"
    policy.write_text(policy_toml(args, out / "ckpt"), encoding="utf-8")
    check = subprocess.run(
        [sys.executable, "-m", "nvtrain", "validate", str(policy)], capture_output=True, text=True
    )
    if check.returncode != 0:
        sys.exit(f"pod0_loss: nvtrain validate rejected {policy}:\n{check.stdout}{check.stderr}")
    run_dir = out / "ckpt" / run_id  # every pod's events log: events-node<N>.jsonl
    argv = [*prefix, sys.executable, "-m", "nvtrain", "run", str(policy), "--run-id", run_id]
    victim = args.kill_pod
    control = None
    if args.store == CONTROL:  # the store's own pod, started first as in the manifest's order
        control = Pod(
            CONTROL, 0, [*prefix, sys.executable, "-m", "nvtrain", "control", str(policy)], out, tmp
        )
    pods = {i: Pod(i, 0, argv, out, tmp) for i in range(args.nodes)}
    started = time.monotonic()
    all_pods = list(pods.values()) + ([control] if control else [])
    try:
        reached = wait_until(
            f"step {args.kill_at}",
            started + args.timeout,
            lambda: (
                last_step(read_events(run_dir)) >= args.kill_at
                or any(p.proc.poll() is not None for p in all_pods)
            ),
        )
        step_at_kill = last_step(read_events(run_dir))
        if not reached or any(p.proc.poll() is not None for p in all_pods):
            sys.exit(
                f"pod0_loss: no kill: step {step_at_kill}, exit codes {[p.proc.poll() for p in all_pods]}"
            )
        killed_at = time.time()
        killed = pods[victim].kill()
        print(f"pod0_loss: killed pod {victim} ({killed} processes) at step {step_at_kill}", flush=True)
        if args.down >= 0:
            time.sleep(args.down)
            pods[victim] = Pod(victim, 1, argv, out, tmp)
            all_pods.append(pods[victim])
        else:  # a node lost for good: the others (a hot spare among them) must carry on
            del pods[victim]
        restarted_at = time.time()
        finished = wait_until(
            "every pod to exit",
            time.monotonic() + args.timeout,
            lambda: all(p.proc.poll() is not None for p in pods.values()),
        )
        if control is not None:  # it ends by itself once the rendezvous is closed
            wait_until(
                "the control pod to exit", time.monotonic() + 60, lambda: control.proc.poll() is not None
            )
    finally:
        for pod in all_pods:
            pod.kill()
    events = read_events(run_dir)
    after = [e for e in events if e.ts > killed_at]
    # A step after the kill counts as recovered only from a new attempt (new process or
    # in-process iteration): a survivor may still log the step it had in flight.
    before = {(e.pid, e.attempt) for e in events if isinstance(e, Step) and e.ts <= killed_at}
    steps = [e for e in after if isinstance(e, Step) and (e.pid, e.attempt) not in before]
    first = steps[0] if steps else None
    launcher = [
        launcher_row(e, killed_at)
        for e in after
        if e.by_launcher and not isinstance(e, DnsWait | LauncherStarted)
    ]
    return {
        "nvrx": importlib.metadata.version("nvidia-resiliency-ext"),
        "torch": importlib.metadata.version("torch"),
        "run_id": run_id,
        "killed_pod": victim,
        "store": args.store,
        "in_process": args.in_process,
        "step_at_kill": step_at_kill,
        "exit_codes": {
            (f"pod{i}_restarted" if i == victim else f"pod{i}"): pod.proc.returncode
            for i, pod in pods.items()
        }
        | ({"control": control.proc.returncode} if control else {}),
        "finished_in_time": finished,
        "last_step": last_step(events),
        "steps": args.steps,
        "kill_to_first_step_s": None if first is None else round(first.ts - killed_at, 2),
        "restart_to_first_step_s": None if first is None else round(first.ts - restarted_at, 2),
        "first_step_after_kill": None if first is None else first.step,
        "resumed_from": [e.step for e in after if isinstance(e, CheckpointRestored)],
        "launcher_events_after_kill": launcher[:40],
        "events": str(run_dir),
        "tails": {p.log.name: p.tail(40) for p in all_pods},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kill-pod", type=int, choices=(0, 1, 2), default=0, help="pod to kill (default 0)")
    parser.add_argument("--nodes", type=int, choices=(2, 3), default=2, help="[rendezvous] nodes")
    parser.add_argument(
        "--min-nodes",
        type=int,
        default=None,
        help="[rendezvous] min_nodes (below --nodes: hot spares on 0.6+)",
    )
    parser.add_argument("--kill-at", type=int, default=40, help="kill once the events log shows this step")
    parser.add_argument(
        "--down",
        type=float,
        default=5.0,
        help="seconds between the kill and the restart; < 0: never restarted",
    )
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds to wait for each phase")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--max-restarts", type=int, default=5, help="[restart.in_job] max_restarts")
    parser.add_argument("--in-process", action="store_true", help="enable in-process restart")
    parser.add_argument(
        "--store",
        choices=("pod0", CONTROL),
        default="pod0",
        help='[rendezvous] store: "control" adds a third pod running `nvtrain control` (NVRx 0.6+)',
    )
    parser.add_argument(
        "--write-hosts", action="store_true", help="append the pod names to /etc/hosts (root)"
    )
    parser.add_argument("--out", type=Path, default=None, help="directory for logs (default: a new temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args()
    if args.kill_pod >= args.nodes:
        parser.error(
            f"--kill-pod {args.kill_pod}: there are only pods 0-{args.nodes - 1} (--nodes {args.nodes})"
        )
    out = (args.out or Path(tempfile.mkdtemp(prefix="pod0loss-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="p0l-"))  # short: ft_launcher puts Unix sockets here
    hosts, original = Path("/etc/hosts"), None
    try:
        prefix: list[str] = []
        if args.write_hosts:
            if os.geteuid() != 0:
                sys.exit("pod0_loss: --write-hosts needs root")
            original = hosts.read_bytes()
            (out / "hosts.orig").write_bytes(original)
            with hosts.open("a", encoding="utf-8") as handle:  # in place: it may be a bind mount
                handle.write(("" if original.endswith(b"\n") else "\n") + hosts_lines())
        elif not resolves():
            prefix = private_hosts_prefix(out)
        report = run(args, out, tmp, prefix)
    finally:
        if original is not None:
            hosts.write_bytes(original)
        shutil.rmtree(tmp, ignore_errors=True)
    for name, lines in report["tails"].items():
        print(f"--- {out / name} (tail) ---\n" + "\n".join(lines[-15:]))
    for event in report["launcher_events_after_kill"]:
        print("launcher after kill:", json.dumps(event))
    summary = {k: v for k, v in report.items() if k not in ("tails", "launcher_events_after_kill")}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0 if all(code == 0 for code in report["exit_codes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

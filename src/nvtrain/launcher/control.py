"""The control pod: the rendezvous store in a process of its own (``[rendezvous] store = "control"``).

NVRx 0.6 and later ship ``nvrx-control``: it hosts the TCPStore and closes each rendezvous round
without training itself, so no training pod is special. ``nvtrain control`` runs it in a small
CPU pod named ``<job>-control``, with arguments built from the policy by ``build_control_plan``
(printed by ``--dry-run``), and supervises it the way ``nvtrain run`` supervises ft_launcher:
own session, signals passed on, TERM -> ``stop_timeout`` -> KILL, nothing left behind.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import signal
import time
from collections.abc import Callable, Mapping
from types import FrameType

from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError, signal_exit_code
from nvtrain.launcher.dns import PodNames, Resolver, resolve, wait_until_resolvable
from nvtrain.launcher.plan import rendezvous_id
from nvtrain.launcher.process import Child, become_subreaper, kill_all
from nvtrain.nvrx import NvrxVersion
from nvtrain.nvrx.names import CONTROL_PLANE

__all__ = ["CONTROL_MODULE", "ControlPlan", "build_control_plan", "run_control"]

CONTROL_MODULE = CONTROL_PLANE
"""The module behind NVRx's ``nvrx-control`` script (0.6, 0.7)."""

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class ControlPlan:
    """Everything needed to start the store process; printed by ``nvtrain control --dry-run``."""

    argv: list[str]
    endpoint: str
    rendezvous_id: str
    wait_for: str
    """This pod's own DNS name: the store connects to itself through it, and the training pods
    dial it, so it must resolve before the store starts."""
    stop_timeout: float

    def shell(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def build_control_plan(
    policy: Policy,
    nvrx: NvrxVersion,
    *,
    python: str,
    address: str | None = None,
    names: PodNames | None = None,
) -> ControlPlan:
    """The ``nvrx-control`` command line for ``policy``; a usage error when the policy or the
    installed NVRx has no use for a control pod. ``names``: the job's DNS names as this pod
    sees them (``launcher.identity.pod_names``); default: the policy's."""
    r = policy.rendezvous
    if r.store != "control":
        raise UsageError(
            f'[rendezvous] store = "{r.store}": the store lives in pod 0, so there is nothing '
            "for a control pod to run",
            'set [rendezvous] store = "control" in the policy (NVRx 0.6 or later), or do not '
            "start `nvtrain control`",
        )
    if r.nodes < 2:
        raise UsageError(
            f"[rendezvous] nodes = {r.nodes}: a one-node job runs standalone on localhost and "
            "never dials a control pod",
            "start `nvtrain control` only for jobs of two or more nodes",
        )
    if not nvrx.has_control_plane:
        raise UsageError(
            f"NVRx {nvrx} has no control-plane process (nvrx-control arrived in 0.6)",
            'install nvidia-resiliency-ext 0.6 or later in the image, or use [rendezvous] store = "pod0"',
        )
    name = (names or PodNames.of(policy)).control()
    endpoint = f"{name}:{r.port}"
    rid = rendezvous_id(policy)
    argv = [
        python,
        "-m",
        CONTROL_MODULE,
        f"--nnodes={policy.min_nodes}:{r.nodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rid}",
        f"--rdzv-conf=join_timeout={math.ceil(r.join_timeout)}",
        # No log funnel: the pods' logs go to their own stdout, where Kubernetes collects them.
        "--ft-enable-log-server=false",
    ]
    if address:
        argv.append(f"--local-addr={address}")
    return ControlPlan(argv, endpoint, rid, name, policy.job.stop_timeout)


def run_control(
    plan: ControlPlan,
    policy: Policy,
    env: Mapping[str, str],
    *,
    say: Say,
    resolver: Resolver = resolve,
) -> int:
    """Wait for this pod's name, run the store process until it ends, and return the exit
    code for the pod: its own, or 128+N after signal N (``DnsTimeout``, exit 3, propagates)."""
    received: list[int] = []
    child: list[Child] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if not received:
            received.append(signum)
            say(f"signal {signal.Signals(signum).name}: stopping the store process")
        if child:
            child[0].send(signal.SIGTERM)
        else:
            raise _Stopped()

    previous = {s: signal.signal(s, on_signal) for s in _FORWARDED}
    try:
        addresses = wait_until_resolvable(
            plan.wait_for,
            policy.rendezvous.dns_timeout,
            resolver=resolver,
            on_retry=lambda waited, err: say(
                f"waiting for {plan.wait_for} to resolve ({err}, {waited:.0f}s)"
            ),
        )
        say(f"{plan.wait_for} resolves to {', '.join(addresses)}; starting the rendezvous store")
        become_subreaper()
        child.append(Child(plan.argv, env, capture=False))
        say(f"store process pid {child[0].pid}: {plan.shell()}")
        code = _wait(child[0], received, plan.stop_timeout)
    except _Stopped:
        code = None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        kill_all(timeout=2.0)
    if received:
        return signal_exit_code(received[0])
    assert code is not None
    say(f"store process exited with {code}")
    return 128 - code if code < 0 else code


class _Stopped(Exception):
    """A signal arrived before the store process started."""


def _wait(child: Child, received: list[int], stop_timeout: float) -> int:
    deadline: float | None = None
    while True:
        code = child.wait(timeout=0.2)
        if code is not None:
            return code
        if received:
            if deadline is None:
                deadline = time.monotonic() + stop_timeout
            elif time.monotonic() >= deadline:
                return child.stop(time.monotonic())

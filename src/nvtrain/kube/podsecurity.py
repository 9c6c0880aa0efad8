"""Security contexts for the Pod Security Standards (``--pod-security``, ``--run-as-user``).

A namespace labelled ``pod-security.kubernetes.io/enforce=<level>`` refuses pods that break that
level's rules. nvtrain's pods already use no host namespaces, no ``hostPath``, no host ports and
no privileged container, so they pass ``baseline`` as they are, except for one thing: with an
RDMA device (``--efa``, ``--resource``) the training container adds the ``IPC_LOCK``
capability, which RDMA needs to pin memory and which neither level allows.

- ``baseline``: nothing is added; RDMA is refused, so that the pods pass.
- ``restricted``: every pod runs as a non-root user (``runAsNonRoot``, ``runAsUser`` =
  ``--run-as-user``, default ``DEFAULT_UID``) with the runtime's default seccomp profile, and
  every container drops all capabilities and cannot gain privileges.

``--run-as-user`` alone (no level) sets the user and group of the pods without the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nvtrain.errors import UsageError

__all__ = [
    "BASELINE_CAPABILITIES",
    "DEFAULT_UID",
    "LEVELS",
    "check_pod_security",
    "container_context",
    "pod_context",
]

LEVELS = ("baseline", "restricted")
"""Values of ``--pod-security``: the Pod Security Standards levels below ``privileged``."""

DEFAULT_UID = 1000
"""User (and group) the pods run as with ``--pod-security restricted`` and no ``--run-as-user``:
the user that the starter Dockerfile creates."""

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
"""The capabilities that the ``baseline`` level lets a container add (``restricted`` only
``NET_BIND_SERVICE``). ``IPC_LOCK`` is not one of them."""

_INT32_MAX = 2**31 - 1


def check_pod_security(level: str | None, run_as_user: int | None, rdma_flags: Sequence[str]) -> None:
    """``--pod-security`` must be a level, ``--run-as-user`` a user id the level allows, and no
    RDMA device (``rdma_flags``: the options that ask for one, as given) may come with a level."""
    if level is not None and level not in LEVELS:
        raise UsageError(
            f"--pod-security {level!r} is not a Pod Security Standards level nvtrain renders",
            "use --pod-security baseline or --pod-security restricted (or leave it out for privileged)",
        )
    if run_as_user is not None and not 0 <= run_as_user <= _INT32_MAX:
        raise UsageError(
            f"--run-as-user {run_as_user} is not a user id",
            f"give a number from 0 (root) to {_INT32_MAX:,}, e.g. --run-as-user {DEFAULT_UID}",
        )
    if level == "restricted" and run_as_user == 0:
        raise UsageError(
            "--run-as-user 0 is root, which --pod-security restricted does not allow",
            f"give a non-root user, e.g. --run-as-user {DEFAULT_UID} (the starter image's user)",
        )
    if level is not None and rdma_flags:
        raise UsageError(
            f"{' and '.join(rdma_flags)} gives the training container the IPC_LOCK capability (RDMA "
            f"pins memory), which --pod-security {level} does not allow: the namespace would refuse "
            "the pods",
            "leave out --pod-security and run the job in a namespace that allows IPC_LOCK "
            "(pod-security.kubernetes.io/enforce=privileged, or a Pod Security exemption), or leave "
            "out the RDMA devices",
        )


def pod_context(level: str | None, run_as_user: int | None) -> dict[str, Any] | None:
    """The pod's ``securityContext``, or None when there is nothing to set."""
    uid = run_as_user if run_as_user is not None else DEFAULT_UID if level == "restricted" else None
    context: dict[str, Any] = {}
    if uid == 0:
        context.update(runAsUser=0, runAsGroup=0)
    elif uid is not None:
        # fsGroup: volumes that support ownership management (not most NFS or Lustre drivers)
        # are made writable by the group, checked at the volume's root only after the first time.
        context.update(runAsNonRoot=True, runAsUser=uid, runAsGroup=uid, fsGroup=uid)
        context["fsGroupChangePolicy"] = "OnRootMismatch"
    if level == "restricted":
        context["seccompProfile"] = {"type": "RuntimeDefault"}
    return context or None


def container_context(level: str | None, *, rdma: bool) -> dict[str, Any] | None:
    """A container's ``securityContext``: ``IPC_LOCK`` added for RDMA (no level), all capabilities
    dropped and no privilege escalation (``restricted``), or None."""
    if level == "restricted":
        return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if rdma:
        assert level is None, "check_pod_security refuses RDMA with a level"
        return {"capabilities": {"add": ["IPC_LOCK"]}}
    return None

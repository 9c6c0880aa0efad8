"""Stable DNS names of the job's pods (headless Service) and waiting for them to resolve."""

from __future__ import annotations

import dataclasses
import random
import socket
import time
from collections.abc import Callable

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode, NvtrainError

__all__ = [
    "CONTROL_SUFFIX",
    "DnsTimeout",
    "PodNames",
    "Resolver",
    "control_name",
    "pod_name",
    "resolve",
    "store_name",
    "wait_until_resolvable",
]

CONTROL_SUFFIX = "control"
"""The control pod's hostname is ``<job>-control`` (``[rendezvous] store = "control"``)."""

Resolver = Callable[[str], list[str]]


class DnsTimeout(NvtrainError):
    """A peer's DNS name did not resolve before ``rendezvous.dns_timeout`` (exit 3)."""

    exit_code = ExitCode.RENDEZVOUS

    def __init__(self, name: str, waited: float, last_error: str) -> None:
        self.name = name
        self.waited = waited
        off_pod = (
            ""
            if _kubernetes_name(name)
            else (
                "off Kubernetes, the store's host ([rendezvous] host, --master-addr, --rdzv-endpoint, "
                "or the first node of Slurm's node list) is not in this node's DNS or /etc/hosts: "
                "give node 0's IP address (--master-addr ADDR) or add the name to /etc/hosts; on "
                "Kubernetes, "
            )
        )
        super().__init__(
            f"{name} did not resolve within {waited:.0f}s ({last_error}). Likely causes: {off_pod}"
            f"{_missing_service(name)}; the pod spec lacks `subdomain: <service>`, or names "
            "another Service than [rendezvous] service; the Service does not set "
            "`publishNotReadyAddresses: true`; or pod 0 is not running"
        )


def _kubernetes_name(name: str) -> bool:
    """Whether ``name`` is a pod's name under a headless Service: ``<pod>.<service>.<namespace>.
    svc.<cluster domain>``."""
    parts = name.split(".")
    return len(parts) >= 5 and parts[3] == "svc"


def _missing_service(name: str) -> str:
    """The first likely cause of ``name`` not resolving: no headless Service of the name that the
    pods' ``subdomain`` gives, most often after a rename."""
    parts = name.split(".")
    renamed = (
        "a Kustomize namePrefix or nameSuffix renames the Service but not the pods' `subdomain` "
        '(docs/kubernetes.md, "Kustomize")'
    )
    if len(parts) >= 5 and parts[3] == "svc":
        service, namespace = parts[1], parts[2]
        return (
            f"no headless Service named {service!r} (the pods' subdomain) in namespace {namespace!r}: "
            f"check `kubectl get service {service} -n {namespace}`; {renamed}"
        )
    return f"the headless Service is missing or named differently from the pods' subdomain; {renamed}"


@dataclasses.dataclass(frozen=True)
class PodNames:
    """The stable DNS names of one job's pods: pod *i* is ``<base>-<i>.<domain>``, the control pod
    ``<control_host>.<domain>``.

    ``of(policy)`` gives the names the policy implies. In a pod, ``launcher.identity`` takes
    ``base`` and ``domain`` from the pod's own hostname and DNS name instead, so that a Job and
    Service renamed after rendering (Kustomize ``namePrefix``, ``namespace``) find their peers."""

    base: str
    """What pod hostnames are made of: ``<base>-<index>`` (the Job's real name)."""
    domain: str
    """``<subdomain>.<namespace>.svc.<cluster domain>``."""
    control_host: str
    """The control pod's hostname (``[rendezvous] store = "control"``): ``<[job] name>-control``,
    which the manifest sets literally, so a rename leaves it as it is."""

    @classmethod
    def of(cls, policy: Policy) -> PodNames:
        """``[job] name``, and ``<[rendezvous] service>.<namespace>.svc.<cluster_domain>``."""
        r = policy.rendezvous
        return cls(
            base=policy.job.name,
            domain=f"{policy.service}.{r.namespace}.svc.{r.cluster_domain}",
            control_host=f"{policy.job.name}-{CONTROL_SUFFIX}",
        )

    def pod(self, index: int) -> str:
        return f"{self.base}-{index}.{self.domain}"

    def control(self) -> str:
        return f"{self.control_host}.{self.domain}"

    def store(self, store: str) -> str:
        """DNS name of the rendezvous store's host for ``[rendezvous] store``: pod 0, or the
        control pod."""
        return self.control() if store == "control" else self.pod(0)


def pod_name(policy: Policy, index: int) -> str:
    """``<job>-<index>.<service>.<namespace>.svc.<cluster domain>``."""
    return PodNames.of(policy).pod(index)


def control_name(policy: Policy) -> str:
    """``<job>-control.<service>.<namespace>.svc.<cluster domain>``: the pod of ``nvtrain control``."""
    return PodNames.of(policy).control()


def store_name(policy: Policy, names: PodNames | None = None) -> str:
    """DNS name of the rendezvous store's host: pod 0, or the control pod (``names``: this
    pod's view of them; default: the policy's)."""
    return (names or PodNames.of(policy)).store(policy.rendezvous.store)


def resolve(name: str) -> list[str]:
    """IPv4/IPv6 addresses of ``name`` (no cache of ours: asked again on every call)."""
    infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    return sorted({str(info[4][0]) for info in infos})


def wait_until_resolvable(
    name: str,
    timeout: float,
    *,
    resolver: Resolver = resolve,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[float, str], None] | None = None,
    jitter: Callable[[], float] = random.random,
) -> list[str]:
    """Resolve ``name``, retrying with backoff (0.5 s doubling to 5 s) until ``timeout``. Each
    wait is between half and all of its step (``jitter()``, in [0, 1], picks where), so that the
    pods of a large job, started together, do not ask the DNS server together."""
    start = clock()
    delay = 0.5
    while True:
        try:
            addresses = resolver(name)
            if addresses:
                return addresses
            error = "no addresses"
        except OSError as exc:
            error = exc.strerror or str(exc)
        waited = clock() - start
        if waited >= timeout:
            raise DnsTimeout(name, waited, error)
        if on_retry is not None:
            on_retry(waited, error)
        sleep(min(delay * (0.5 + 0.5 * jitter()), max(timeout - waited, 0.0)))
        delay = min(delay * 2, 5.0)

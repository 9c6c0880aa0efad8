"""Stable DNS names of the job's pods (headless Service) and waiting for them to resolve."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable

from nvtrain.config.schema import Policy
from nvtrain.errors import ExitCode, NvtrainError

__all__ = [
    "CONTROL_SUFFIX",
    "DnsTimeout",
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
        super().__init__(
            f"{name} did not resolve within {waited:.0f}s ({last_error}). Likely causes: the "
            "headless Service is missing or named differently from [rendezvous] service; the "
            "pod spec lacks `subdomain: <service>`; the Service does not set "
            "`publishNotReadyAddresses: true`; or pod 0 is not running"
        )


def pod_name(policy: Policy, index: int) -> str:
    """``<job>-<index>.<service>.<namespace>.svc.<cluster domain>``."""
    r = policy.rendezvous
    return f"{policy.job.name}-{index}.{policy.service}.{r.namespace}.svc.{r.cluster_domain}"


def control_name(policy: Policy) -> str:
    """``<job>-control.<service>.<namespace>.svc.<cluster domain>``: the pod of ``nvtrain control``."""
    r = policy.rendezvous
    return f"{policy.job.name}-{CONTROL_SUFFIX}.{policy.service}.{r.namespace}.svc.{r.cluster_domain}"


def store_name(policy: Policy) -> str:
    """DNS name of the rendezvous store's host: pod 0, or the control pod."""
    return control_name(policy) if policy.rendezvous.store == "control" else pod_name(policy, 0)


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

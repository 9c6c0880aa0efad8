"""Waiting for the stable DNS names of the job's pods (headless Service) to resolve.

The names themselves (``PodNames``, ``pod_name``, ``control_name``, ``store_name``) are made in
``nvtrain.kubenames``, the one module of Kubernetes naming, and re-exported here for the launcher.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable

from nvtrain.errors import ExitCode, NvtrainError
from nvtrain.kubenames import CONTROL_SUFFIX, PodNames, control_name, headless_service, pod_name, store_name

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

Resolver = Callable[[str], list[str]]


class DnsTimeout(NvtrainError):
    """A peer's DNS name did not resolve before ``rendezvous.dns_timeout`` (exit 3)."""

    exit_code = ExitCode.RENDEZVOUS

    def __init__(self, name: str, waited: float, last_error: str) -> None:
        self.name = name
        self.waited = waited
        off_pod = (
            ""
            if headless_service(name) is not None
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


def _missing_service(name: str) -> str:
    """The first likely cause of ``name`` not resolving: no headless Service of the name that the
    pods' ``subdomain`` gives, most often after a rename."""
    renamed = (
        "a Kustomize namePrefix or nameSuffix renames the Service but not the pods' `subdomain` "
        '(docs/kubernetes.md, "Kustomize")'
    )
    found = headless_service(name)
    if found is not None:
        service, namespace = found
        return (
            f"no headless Service named {service!r} (the pods' subdomain) in namespace {namespace!r}: "
            f"check `kubectl get service {service} -n {namespace}`; {renamed}"
        )
    return f"the headless Service is missing or named differently from the pods' subdomain; {renamed}"


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

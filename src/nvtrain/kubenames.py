"""Kubernetes names in one place: the forms Kubernetes gives names, label keys and values, and the
names of one job's pods.

The rules: a DNS label (RFC 1123: pod hostnames, namespaces), a DNS-1035 label (a letter first:
Service names), a DNS subdomain (most object names), qualified names (label and annotation keys)
and label values; the ``check_*`` functions raise a ``UsageError`` that names the option, the
value and what would do, so that ``nvtrain manifest`` refuses what the API server would refuse.

The names: pod *i* of a job is ``<job>-<i>.<service>.<namespace>.svc.<cluster domain>`` under
the headless Service, and with ``[rendezvous] store = "control"`` the control pod is
``<job>-control.<...>`` (``PodNames``). ``launcher.dns`` resolves these names, ``nvtrain.kube``
renders the objects that give them and checks manifests against them.

Below both, and below ``config``: this module imports only ``nvtrain.errors``. A policy is read
through the ``NamedJob`` protocol (``config.schema.Policy`` is one), not by importing it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Protocol

from nvtrain.errors import UsageError

__all__ = [
    "CONTROL_CHARS",
    "CONTROL_SUFFIX",
    "DNS_1035_LABEL",
    "DNS_LABEL",
    "DNS_LABEL_MAX",
    "DNS_SUBDOMAIN",
    "DNS_SUBDOMAIN_MAX",
    "LABEL_VALUE",
    "QUALIFIED_NAME",
    "REPLICATED_JOB",
    "TRAINJOB_ENV",
    "NamedJob",
    "PodNames",
    "check_dns_label",
    "check_dns_subdomain",
    "check_qualified_name",
    "control_hostname",
    "control_name",
    "headless_service",
    "is_dns_1035_label",
    "is_dns_label",
    "is_dns_subdomain",
    "pod_hostname",
    "pod_name",
    "service_domain",
    "store_name",
]

# -- the rules -------------------------------------------------------------------------------------

DNS_LABEL_MAX = 63
"""Characters of a DNS label: a pod's hostname, a namespace, a Service name, a label's name part."""
DNS_SUBDOMAIN_MAX = 253
"""Characters of a DNS subdomain: most object names, the prefix of a qualified name."""

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
"""An RFC 1123 label (with ``fullmatch``; the length is ``DNS_LABEL_MAX``'s to check)."""
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
"""An RFC 1035 label, a letter first: Service names, and the names the JobSet webhook accepts."""
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
"""Names of most objects (a PersistentVolumeClaim, a PriorityClass, a ServiceAccount), at most
253 characters."""
_LABEL_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
QUALIFIED_NAME = re.compile(rf"({DNS_SUBDOMAIN}/)?{_LABEL_NAME}")
"""Label and annotation keys, taint keys: ``[prefix/]name``."""
LABEL_VALUE = re.compile(rf"{_LABEL_NAME}?")
"""Label values (and taint values): at most 63 characters, empty allowed."""
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def is_dns_label(text: str) -> bool:
    """Whether ``text`` is a DNS label: lowercase letters, digits and '-', a letter or digit at
    both ends, at most 63 characters."""
    return DNS_LABEL.fullmatch(text) is not None and len(text) <= DNS_LABEL_MAX


def is_dns_1035_label(text: str) -> bool:
    """Whether ``text`` is a DNS-1035 label: a DNS label that starts with a letter."""
    return DNS_1035_LABEL.fullmatch(text) is not None and len(text) <= DNS_LABEL_MAX


def is_dns_subdomain(text: str) -> bool:
    """Whether ``text`` is a DNS subdomain: DNS labels joined by dots, at most 253 characters."""
    return re.fullmatch(DNS_SUBDOMAIN, text) is not None and len(text) <= DNS_SUBDOMAIN_MAX


def check_dns_subdomain(flag: str, value: str, what: str) -> None:
    """``value`` of ``flag`` must be a DNS subdomain: the name of a ``what``."""
    if not is_dns_subdomain(value):
        raise UsageError(
            f"{flag} {value!r} is not a {what} name",
            "use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
        )


def check_dns_label(flag: str, value: str, what: str) -> None:
    """``value`` of ``flag`` must be a DNS label (at most 63 characters, no dots)."""
    if not is_dns_label(value):
        raise UsageError(
            f"{flag} {value!r} is not a {what} name",
            "use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        )


def check_qualified_name(flag: str, key: str) -> None:
    """``key`` of ``flag`` must be a qualified name (``example.com/name`` or ``name``)."""
    prefix, _, name = key.rpartition("/")
    if not QUALIFIED_NAME.fullmatch(key) or len(prefix) > DNS_SUBDOMAIN_MAX or len(name) > DNS_LABEL_MAX:
        raise UsageError(
            f"{flag} key {key!r} is not valid",
            "use a Kubernetes qualified name, e.g. example.com/team or team",
        )


# -- the names of a job's pods -----------------------------------------------------------------------

CONTROL_SUFFIX = "control"
"""The control pod's hostname is ``<job>-control`` (``[rendezvous] store = "control"``); so are
its Job's name and, in a JobSet, the name of its replicated job."""


class _JobTable(Protocol):
    @property
    def name(self) -> str: ...


class _RendezvousTable(Protocol):
    @property
    def namespace(self) -> str: ...

    @property
    def cluster_domain(self) -> str: ...

    @property
    def store(self) -> str: ...


class NamedJob(Protocol):
    """What names a job's pods: ``[job] name``, the Service (``[rendezvous] service``, by default
    the job's name) and ``[rendezvous]``'s namespace, cluster domain and store. A validated
    ``config.schema.Policy`` is one."""

    @property
    def job(self) -> _JobTable: ...

    @property
    def rendezvous(self) -> _RendezvousTable: ...

    @property
    def service(self) -> str: ...


def pod_hostname(base: str, index: int) -> str:
    """``<base>-<index>``: the hostname that an Indexed Job named ``base`` gives pod ``index``."""
    return f"{base}-{index}"


def control_hostname(job: str) -> str:
    """``<job>-control``: the control pod's hostname, and its Job's name."""
    return f"{job}-{CONTROL_SUFFIX}"


def service_domain(service: str, namespace: str, cluster_domain: str) -> str:
    """``<service>.<namespace>.svc.<cluster domain>``: the domain of the pods of a headless
    Service (the pods' ``subdomain``)."""
    return f"{service}.{namespace}.svc.{cluster_domain}"


def headless_service(name: str) -> tuple[str, str] | None:
    """(Service, namespace) of a pod's DNS name under a headless Service (``<pod>.<service>.
    <namespace>.svc.<cluster domain>``), or None when ``name`` does not have that shape."""
    parts = name.split(".")
    if len(parts) >= 5 and parts[3] == "svc":
        return parts[1], parts[2]
    return None


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
    def of(cls, policy: NamedJob) -> PodNames:
        """``[job] name``, and ``<[rendezvous] service>.<namespace>.svc.<cluster_domain>``."""
        r = policy.rendezvous
        return cls(
            base=policy.job.name,
            domain=service_domain(policy.service, r.namespace, r.cluster_domain),
            control_host=control_hostname(policy.job.name),
        )

    def pod(self, index: int) -> str:
        return f"{pod_hostname(self.base, index)}.{self.domain}"

    def control(self) -> str:
        return f"{self.control_host}.{self.domain}"

    def store(self, store: str) -> str:
        """DNS name of the rendezvous store's host for ``[rendezvous] store``: pod 0, or the
        control pod."""
        return self.control() if store == "control" else self.pod(0)


def pod_name(policy: NamedJob, index: int) -> str:
    """``<job>-<index>.<service>.<namespace>.svc.<cluster domain>``."""
    return PodNames.of(policy).pod(index)


def control_name(policy: NamedJob) -> str:
    """``<job>-control.<service>.<namespace>.svc.<cluster domain>``: the pod of ``nvtrain control``."""
    return PodNames.of(policy).control()


def store_name(policy: NamedJob, names: PodNames | None = None) -> str:
    """DNS name of the rendezvous store's host: pod 0, or the control pod (``names``: this
    pod's view of them; default: the policy's)."""
    return (names or PodNames.of(policy)).store(policy.rendezvous.store)


TRAINJOB_ENV = "NVTRAIN_TRAINJOB"
"""The variable that holds the TrainJob's name in the pods of nvtrain's Trainer runtime (set by
``kube.trainer_env``, read by ``launcher.trainjob``)."""

REPLICATED_JOB = "node"
"""The runtime's replicated Job (Trainer's ``constants.Node``): JobSet's Job ``<t>-node-0``."""

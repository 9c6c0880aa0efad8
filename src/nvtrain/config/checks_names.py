"""Kubernetes names a policy gives: the job's pods, its Service, namespace and cluster domain.

The rules are ``nvtrain.kubenames``' (DNS labels, DNS-1035 labels for Services, 63 characters,
pod ``<job>-<index>`` and the control pod ``<job>-control``); these checks say which key breaks
them and what would do. A name is matched whole: a trailing newline (``"abc\\n"``, written in
TOML as an escape) is not a DNS label, as the manifests and the run id already refused it.
"""

from __future__ import annotations

from collections.abc import Iterator

from nvtrain.config.checks_base import finding as _f
from nvtrain.config.checks_base import suggest_label
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding
from nvtrain.kubenames import (
    DNS_LABEL_MAX,
    DNS_SUBDOMAIN_MAX,
    control_hostname,
    is_dns_1035_label,
    is_dns_label,
    pod_hostname,
)

__all__ = ["names"]


def _longest_hostname(p: Policy, name: str) -> str:
    """The longest pod hostname of the job: the last index's, or the control pod's."""
    last = pod_hostname(name, p.rendezvous.nodes - 1)
    control = control_hostname(name)
    return control if p.rendezvous.store == "control" and len(control) > len(last) else last


def names(p: Policy) -> Iterator[Finding]:
    """``[job] name`` and ``[rendezvous]`` service, namespace and cluster domain."""
    yield from _job_name(p)
    yield from _service(p)
    namespace = p.rendezvous.namespace
    if not is_dns_label(namespace):
        yield _f(
            "error",
            "dns-name",
            "rendezvous",
            "namespace",
            namespace,
            "must be a DNS label (lowercase letters, digits, '-'; at most 63)",
            f'e.g. namespace = "{suggest_label(namespace)}"',
        )
    domain = p.rendezvous.cluster_domain
    if len(domain) > DNS_SUBDOMAIN_MAX or not all(is_dns_label(x) for x in domain.split(".")):
        yield _f(
            "error",
            "dns-name",
            "rendezvous",
            "cluster_domain",
            domain,
            "must be a DNS name: dot-separated labels of lowercase letters, digits, '-'",
            'the usual value is "cluster.local"',
        )


def _job_name(p: Policy) -> Iterator[Finding]:
    name = p.job.name
    longest = _longest_hostname(p, name)
    room = DNS_LABEL_MAX - (len(longest) - len(name))  # what the name may have, its suffix added
    if not is_dns_label(name):
        yield _f(
            "error",
            "dns-name",
            "job",
            "name",
            name,
            "must be a DNS label: at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit",
            f'e.g. name = "{suggest_label(name, limit=room)}"',
        )
    elif len(longest) > DNS_LABEL_MAX:
        yield _f(
            "error",
            "dns-name",
            "job",
            "name",
            name,
            (
                f"the control pod's name `{control_hostname(name)}` would be longer than 63 characters"
                if longest == control_hostname(name)
                else f"pod names `{name}-<index>` would be longer than 63 characters"
            ),
            f"shorten the name to at most {room} characters",
        )


def _service(p: Policy) -> Iterator[Finding]:
    name, service = p.job.name, p.rendezvous.service
    if service is not None and not is_dns_1035_label(service):
        yield _f(
            "error",
            "dns-name",
            "rendezvous",
            "service",
            service,
            "must be a Service name (RFC 1035 label): lowercase letters, digits and '-', "
            "starting with a letter, at most 63 characters",
            f'e.g. service = "{suggest_label(service, letter_first=True)}"',
        )
    if service is None and is_dns_label(name) and not is_dns_1035_label(name):
        yield _f(
            "error",
            "dns-name",
            "rendezvous",
            "service",
            None,
            f'defaults to the job name "{name}", which is not a valid Service name '
            "(it must start with a letter)",
            f'set service = "{suggest_label(name, letter_first=True)}"',
        )

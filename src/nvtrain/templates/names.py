"""The forms Kubernetes gives names, label keys and values, and checks that name the option.

Each check raises a ``UsageError`` that names the option and the value and says what would do,
so that ``nvtrain manifest`` refuses what the API server would refuse later.
"""

from __future__ import annotations

import re

from nvtrain.errors import UsageError

__all__ = [
    "CONTROL_CHARS",
    "DNS_SUBDOMAIN",
    "LABEL_VALUE",
    "QUALIFIED_NAME",
    "check_dns_label",
    "check_dns_subdomain",
    "check_qualified_name",
]

_LABEL_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
"""Names of most objects (a PersistentVolumeClaim, a PriorityClass, a ServiceAccount), at most
253 characters."""
QUALIFIED_NAME = re.compile(rf"({DNS_SUBDOMAIN}/)?{_LABEL_NAME}")
"""Label and annotation keys, taint keys: ``[prefix/]name``."""
LABEL_VALUE = re.compile(rf"{_LABEL_NAME}?")
"""Label values (and taint values): at most 63 characters, empty allowed."""
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def check_dns_subdomain(flag: str, value: str, what: str) -> None:
    """``value`` of ``flag`` must be a DNS subdomain: the name of a ``what``."""
    if not re.fullmatch(DNS_SUBDOMAIN, value) or len(value) > 253:
        raise UsageError(
            f"{flag} {value!r} is not a {what} name",
            "use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
        )


def check_dns_label(flag: str, value: str, what: str) -> None:
    """``value`` of ``flag`` must be a DNS label (at most 63 characters, no dots)."""
    if not _DNS_LABEL.fullmatch(value) or len(value) > 63:
        raise UsageError(
            f"{flag} {value!r} is not a {what} name",
            "use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        )


def check_qualified_name(flag: str, key: str) -> None:
    """``key`` of ``flag`` must be a qualified name (``example.com/name`` or ``name``)."""
    prefix, _, name = key.rpartition("/")
    if not QUALIFIED_NAME.fullmatch(key) or len(prefix) > 253 or len(name) > 63:
        raise UsageError(
            f"{flag} key {key!r} is not valid",
            "use a Kubernetes qualified name, e.g. example.com/team or team",
        )

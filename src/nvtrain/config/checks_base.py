"""What every module of cross-field checks shares: a finding built from plain values, durations
in words, a DNS label suggested from any text.

The rules themselves live in ``checks.py`` (which runs them all) and in ``checks_*.py`` by
concern: names, heartbeats, the timeout order, checkpoints, NVRx versions, measured timings.
"""

from __future__ import annotations

import re

from nvtrain.config.duration import format_duration
from nvtrain.findings import Finding, Severity, toml_value
from nvtrain.kubenames import DNS_LABEL_MAX

__all__ = ["duration", "finding", "suggest_label"]


def finding(
    severity: Severity, code: str, table: str, key: str | None, value: object, rule: str, fix: str
) -> Finding:
    """A finding on ``[table] key`` with ``value`` shown as TOML (a float as a duration)."""
    shown = (
        None if value is None else toml_value(format_duration(value) if isinstance(value, float) else value)
    )
    return Finding(severity, code, table, key, rule, fix, shown)


def duration(seconds: float) -> str:
    """``seconds`` as the policy file writes it (``"1m30s"``)."""
    return format_duration(seconds)


def suggest_label(text: str, letter_first: bool = False, limit: int = DNS_LABEL_MAX) -> str:
    """A DNS label made from ``text`` for a finding's fix (a letter first when asked)."""
    limit = max(1, min(limit, DNS_LABEL_MAX))
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")
    if letter_first and not label[:1].isalpha():
        label = ("x-" + label)[:limit].strip("-")
    return label or "my-job"

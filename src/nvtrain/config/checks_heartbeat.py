"""``[heartbeat]``: the order of its timeouts, how often the monitor looks, the sections' names
and timeouts (they go on ft_launcher's command line)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from nvtrain.config.checks_base import duration as _d
from nvtrain.config.checks_base import finding as _f
from nvtrain.config.checks_timeouts import order
from nvtrain.config.derive import MAX_DURATION
from nvtrain.config.schema import Policy
from nvtrain.findings import Finding, toml_value

__all__ = ["heartbeat"]


def heartbeat(p: Policy) -> Iterator[Finding]:
    """``[heartbeat]``: its timeouts' order, the monitor's interval, the sections."""
    hb = p.heartbeat
    yield from order(p, in_process=False)  # initial_timeout >= timeout
    fixed = [
        (v, k) for v, k in ((hb.timeout, "timeout"), (hb.initial_timeout, "initial_timeout")) if v is not None
    ]
    if fixed and hb.monitor_interval >= min(fixed)[0]:
        limit, key = min(fixed)
        yield _f(
            "error",
            "heartbeat-interval",
            "heartbeat",
            "monitor_interval",
            hb.monitor_interval,
            f"must be shorter than {key} ({_d(limit)}), or hangs go unnoticed",
            f'use at most "{_d(limit / 10)}"',
        )
    yield from _sections(p)


_SECTION_NAME = re.compile(r"[:,\s]")


def _sections(p: Policy) -> Iterator[Finding]:
    """``[heartbeat.sections]``: names fit ft_launcher's ``name:seconds,...`` argument; timeouts
    are longer than the monitor's interval."""
    hb = p.heartbeat
    table = "heartbeat.sections"
    example = 'e.g. step = "30s" or checkpoint = "auto"'
    for name, timeout in hb.sections.items():
        bad = _SECTION_NAME.search(name)
        if not name:
            rule = "a section name must not be empty"
        elif bad is not None:
            char = {":": "':'", ",": "','"}.get(bad.group(), "whitespace")
            rule = (
                f"section name {toml_value(name)} contains {char}: names go on ft_launcher's command "
                "line as `name:seconds,...`, which cannot hold ':', ',' or whitespace"
            )
        elif not name.isprintable():
            rule = f"section name {toml_value(name)} contains a control character"
        else:
            rule = ""
        if rule:
            fix = (
                "use the name the workers pass to start_section(), made of letters, digits, '_', "
                f"'-' or '.' ({example})"
            )
            yield _f("error", "heartbeat-section", table, name, timeout, rule, fix)
        if isinstance(timeout, float) and timeout > MAX_DURATION:
            yield _f(
                "error",
                "duration-limit",
                table,
                name,
                timeout,
                f"is longer than {_d(MAX_DURATION)} (a year): no section is meant to last that long",
                f'use at most "{_d(MAX_DURATION)}", or "auto" to let NVRx compute it',
            )
        elif isinstance(timeout, float) and timeout <= hb.monitor_interval:
            yield _f(
                "warning",
                "heartbeat-interval",
                table,
                name,
                timeout,
                f"is not longer than [heartbeat] monitor_interval ({_d(hb.monitor_interval)}): the "
                "monitor checks sections only that often, so the timeout acts late or not at all",
                f'raise it above "{_d(hb.monitor_interval)}", or lower monitor_interval to at most '
                f'"{_d(timeout / 5)}"',
            )
    outside = hb.out_of_section_timeout
    if isinstance(outside, float) and outside <= hb.monitor_interval:
        yield _f(
            "warning",
            "heartbeat-interval",
            "heartbeat",
            "out_of_section_timeout",
            outside,
            f"is not longer than monitor_interval ({_d(hb.monitor_interval)}): the monitor checks "
            "only that often, so the timeout acts late or not at all",
            f'raise it above "{_d(hb.monitor_interval)}", or lower monitor_interval to at most '
            f'"{_d(outside / 5)}"',
        )

"""Scrapes of a live metrics endpoint (``nvtrain.live``) for the tests: every sample by name and
labels, and a scrape repeated until what a test waits for is served."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from support.waiting import wait_until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Each sample's value by (name, sorted labels)."""


def scrape(port: int) -> Samples:
    """One scrape of ``http://127.0.0.1:PORT/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def scrape_until(port: int, done: Callable[[Samples], bool], what: str) -> Samples:
    """Scrape until ``done`` holds for a scrape (30 s at most); that scrape."""
    got: list[Samples] = []

    def served() -> bool:
        got[:] = [scrape(port)]
        return done(got[0])

    wait_until(served, 30, f"{what} served", detail=lambda: str(sorted(got[0])) if got else "")
    return got[0]

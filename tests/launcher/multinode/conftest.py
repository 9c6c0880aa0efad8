"""Fixtures of the multi-node tests: an emulated cluster of network-namespace pods with a real
dnsmasq serving the headless-Service names (see ``netns_pods.py``).

The tests need root, ``ip netns`` and dnsmasq (``apt-get install -y dnsmasq-base``). Where one of
them is missing the whole directory is skipped with a loud reason; with
``NVTRAIN_MULTINODE=require`` in the environment (set it in CI) it fails instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns_pods import Cluster, cleanup_stale, environment_problem

# Read at import time: the root conftest clears NVTRAIN_* variables around each test.
_REQUIRE = os.environ.get("NVTRAIN_MULTINODE", "").strip().lower() == "require"
_SKIPPED: list[str] = []

JOB = "trainer"


@pytest.fixture(scope="session")
def netns_available() -> None:
    """Skip (or, with NVTRAIN_MULTINODE=require, fail) when namespaces or dnsmasq are missing."""
    problem = environment_problem()
    if problem is None:
        cleanup_stale()
        return
    reason = (
        f"MULTI-NODE TESTS NOT RUN: {problem}. They emulate pods with network namespaces (root, "
        "iproute2, util-linux) and serve pod names with a real dnsmasq (apt-get install -y dnsmasq-base)"
    )
    _SKIPPED.append(reason)
    if _REQUIRE:
        pytest.fail(reason + " (NVTRAIN_MULTINODE=require)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def cluster(netns_available: None, tmp_path: Path) -> Iterator[Cluster]:
    """An empty emulated cluster (bridge + dnsmasq); the test adds pods. Everything is removed
    afterwards, whatever the outcome."""
    with Cluster(tmp_path / "cluster", job=JOB) as c:
        yield c


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SKIPPED:
        terminalreporter.write_sep("!", "multi-node tests skipped", red=True, bold=True)
        terminalreporter.write_line(_SKIPPED[0], red=True, bold=True)

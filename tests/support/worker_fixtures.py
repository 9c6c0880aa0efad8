"""The warm-start server that the worker-library tests fork their ranks from (``warm_server``);
the helpers live in ``worker_helpers.py``. Registered for every folder by ``tests/conftest.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.worker_helpers import WarmServer


@pytest.fixture(scope="session")
def warm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmServer]:
    """One warm-start server per test process, for the ranks the tests run themselves."""
    server = WarmServer(tmp_path_factory.mktemp("warm-server"))
    try:
        yield server
    finally:
        server.close()

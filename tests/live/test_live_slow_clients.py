"""The metrics endpoint (``nvtrain.live.serve``) against clients that send half a request or
nothing: real sockets against the real server. Such a connection is closed once its request
head is late (``READ_DEADLINE``), however slowly it trickles in, and a scrape is served while
many silent connections are open, more than the server serves at once too."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from nvtrain.config.schema import Metrics
from nvtrain.live import MetricsServer, serve
from nvtrain.live.guarded import MAX_CONNECTIONS, READ_DEADLINE
from support.ports import free_port
from support.scraping import scrape

ERRORS = ("nvtrain_metrics_errors_total", (("node_rank", "0"), ("run_id", "r")))
LATE = READ_DEADLINE + 15.0
"""How long a test waits for the server to close a connection: the deadline and slack for a
loaded machine (the old server never closed it)."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MetricsServer]:
    started = serve(
        Metrics(enabled=True, port=free_port(), refresh=0.1),
        tmp_path / "events.jsonl",
        run_id="r",
        node_rank=0,
        address="127.0.0.1",
    )
    yield started
    started.close()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def closed_by_server(conn: socket.socket, timeout: float) -> float:
    """Seconds until the server closed ``conn`` (end of file or reset, no reply); fails if it
    is still open after ``timeout`` seconds or the server replied."""
    start = time.monotonic()
    conn.settimeout(timeout)
    try:
        data = conn.recv(4096)
    except ConnectionResetError:
        data = b""
    except TimeoutError:
        pytest.fail(f"the server still holds the connection after {timeout:.0f} s")
    assert data == b"", f"the server replied to a request it never got whole: {data[:80]!r}"
    return time.monotonic() - start


def test_a_half_sent_request_is_closed_within_the_deadline(server: MetricsServer) -> None:
    with connect(server.port) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: never done
        took = closed_by_server(conn, LATE)
    assert took >= READ_DEADLINE - 0.5


def test_a_request_that_trickles_in_is_closed_at_the_deadline(server: MetricsServer) -> None:
    """Slowloris: a byte at a time keeps a per-read timeout happy; the deadline is for the
    whole head."""
    with connect(server.port) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        start = time.monotonic()
        while time.monotonic() - start < LATE:
            try:
                conn.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                return
            conn.settimeout(0.3)  # the scenario: the client sends a byte every 0.3 s
            try:
                data = conn.recv(4096)
            except TimeoutError:
                continue
            except ConnectionResetError:
                return
            assert data == b"", f"a reply to a request never sent whole: {data[:80]!r}"
            return
        pytest.fail(f"the server still reads a request head trickling in for {LATE:.0f} s")


def test_a_scrape_is_served_while_50_silent_connections_are_open(server: MetricsServer) -> None:
    with ExitStack() as stack:
        silent = [stack.enter_context(connect(server.port)) for _ in range(50)]
        assert scrape(server.port)[ERRORS] == 0.0
        half = silent[0]
        half.sendall(b"GET /metrics HTTP/1.1\r\n")
        assert scrape(server.port)[ERRORS] == 0.0


def test_more_silent_connections_than_it_serves_hold_no_scrape(server: MetricsServer) -> None:
    """Past ``MAX_CONNECTIONS`` the oldest silent connection makes room for the newest: the
    threads and descriptors stay bounded, and the scrape that comes last is served."""
    with ExitStack() as stack:
        before = threading.active_count()
        silent = [stack.enter_context(connect(server.port)) for _ in range(MAX_CONNECTIONS + 20)]
        assert scrape(server.port)[ERRORS] == 0.0
        # Each connection the server holds has a thread: no more than it serves at once.
        assert threading.active_count() - before <= MAX_CONNECTIONS
        # The oldest were closed at once, not at their deadline.
        assert closed_by_server(silent[0], LATE) < READ_DEADLINE

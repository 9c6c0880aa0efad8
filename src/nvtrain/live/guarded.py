"""The metrics endpoint's HTTP server: ``prometheus_client``'s WSGI app behind a server that no
client can hold.

A thread per connection, at most ``MAX_CONNECTIONS`` of them. A connection has ``READ_DEADLINE``
seconds in all to send its request head (request line and headers, at most ``MAX_HEAD`` bytes),
however it trickles in; then it is closed without a reply. The reply must be taken within
``WRITE_DEADLINE`` seconds. When every slot is taken, the oldest connection still sending its
request is closed to make room for the new one: silent connections (slowloris, a flood, a port
scan) cost a thread and a descriptor each for a few seconds at most, and a scrape, which sends
its request at once, is served while they are open.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

__all__ = ["MAX_CONNECTIONS", "MAX_HEAD", "READ_DEADLINE", "WRITE_DEADLINE", "start_server"]

READ_DEADLINE = 5.0
"""Seconds a connection has to send its whole request head."""
WRITE_DEADLINE = 10.0
"""Seconds a connection has to take its reply."""
MAX_CONNECTIONS = 64
"""Connections served at once."""
MAX_HEAD = 16 * 1024
"""Bytes of a request head (a scrape's is a few hundred)."""
_EVICT_WAIT = 2.0
"""How long the accepting thread waits for an evicted connection's thread to end."""

log = logging.getLogger("nvtrain.live")


def read_head(conn: socket.socket, deadline: float, limit: int) -> bytes | None:
    """The request head ``conn`` sends within ``deadline`` seconds (the bytes up to its blank
    line, and any that came with them); None when it closed, sent more than ``limit`` bytes
    without one, or took longer."""
    end = time.monotonic() + deadline
    data = bytearray()
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        left = end - time.monotonic()
        if left <= 0 or len(data) > limit:
            return None
        try:
            conn.settimeout(left)
            chunk = conn.recv(4096)
        except OSError:  # the deadline (TimeoutError), a reset, or closed to make room
            return None
        if not chunk:
            return None
        data += chunk
    return bytes(data)


class _Handler(WSGIRequestHandler):
    """One request per connection, its head read within the deadline; logs nothing."""

    server: _Server

    def handle(self) -> None:
        head = read_head(self.connection, READ_DEADLINE, MAX_HEAD)
        if not self.server.read_done(self.connection) or head is None:
            return
        self.connection.settimeout(WRITE_DEADLINE)
        self.rfile.close()  # nothing was read through it; the socket closes only once it is
        self.rfile = io.BytesIO(head)
        super().handle()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Log nothing (a scrape every few seconds)."""


class _Server(ThreadingMixIn, WSGIServer):
    """``WSGIServer`` with a bounded number of connection threads (``MAX_CONNECTIONS``)."""

    daemon_threads = True
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily) -> None:
        self.address_family = family
        self._lock = threading.Condition()
        self._open = 0
        self._reading: dict[socket.socket, None] = {}
        """The connections still sending their request head, oldest first."""
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if self._open >= MAX_CONNECTIONS and self._reading:
                oldest = next(iter(self._reading))
                del self._reading[oldest]
                with contextlib.suppress(OSError):  # its thread's recv returns at once
                    oldest.shutdown(socket.SHUT_RDWR)
                self._lock.wait_for(lambda: self._open < MAX_CONNECTIONS, _EVICT_WAIT)
            if self._open >= MAX_CONNECTIONS:  # every connection is taking its reply
                self.shutdown_request(request)
                return
            self._open += 1
            self._reading[request] = None
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(request)

    def read_done(self, request: socket.socket) -> bool:
        """The head of ``request`` is read (or never will be): it can no longer be closed to
        make room. False when it was closed to make room already."""
        with self._lock:
            if request not in self._reading:
                return False
            del self._reading[request]
            return True

    def _release(self, request: socket.socket) -> None:
        with self._lock:
            self._reading.pop(request, None)
            self._open -= 1
            self._lock.notify_all()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (the client went away mid-reply): logged at debug level,
        not printed; the others are served on."""
        log.debug("metrics endpoint: the connection from %s failed", client_address, exc_info=True)


def start_server(port: int, address: str, app: Any) -> tuple[_Server, threading.Thread]:
    """Serve the WSGI ``app`` on ``address``:``port`` from a thread of its own (daemon); the
    server (``shutdown``, ``server_close``) and that thread. ``OSError`` when the port cannot
    be bound."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    server = _Server((address, port), family)
    server.set_app(app)
    thread = threading.Thread(target=server.serve_forever, name="nvtrain-metrics-http", daemon=True)
    thread.start()
    return server, thread

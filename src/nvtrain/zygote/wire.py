"""Messages between the client and the server: one JSON object per line, file descriptors
beside the first (``SCM_RIGHTS``)."""

from __future__ import annotations

import json
import socket
from typing import Any

__all__ = ["Reader", "send"]

_MAX_FDS = 3


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    if data:
        sock.sendall(data)


class Reader:
    """Reads messages (and the descriptors sent with them) from one connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.fds: list[int] = []

    def read(self) -> dict[str, Any] | None:
        """The next message; None at the end of the connection."""
        while b"\n" not in self.buffer:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 16, _MAX_FDS)
            self.fds += fds
            if not data:
                return None
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError(f"not a message: {line[:100]!r}")
        return message

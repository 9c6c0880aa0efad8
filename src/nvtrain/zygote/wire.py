"""Messages between the client and the server: one JSON object per line, file descriptors
beside the first (``SCM_RIGHTS``). A line is at most ``MAX_MESSAGE`` bytes and a connection
carries at most ``MAX_FDS`` descriptors; anything else is a ``ValueError``."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

__all__ = ["MAX_FDS", "MAX_MESSAGE", "Reader", "encode", "send"]

MAX_FDS = 3
"""Descriptors a connection may carry: the client's stdin, stdout and stderr."""
MAX_MESSAGE = 1 << 20
"""Bytes in one message (a request holds the client's environment: tens of KiB)."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = encode(message)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    if data:
        sock.sendall(data)


class Reader:
    """Reads messages (and the descriptors sent with them) from one connection: blocking
    (``read``), or one receive at a time on a non-blocking socket (``feed``, then ``message``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.fds: list[int] = []

    def read(self) -> dict[str, Any] | None:
        """The next message; None at the end of the connection. The socket's timeout applies
        to each receive (``TimeoutError``, ``BlockingIOError``); what came is kept."""
        while (message := self.message()) is None:
            if not self.feed():
                return None
        return message

    def feed(self) -> bool:
        """One receive into the buffer; False at the end of the connection. ``ValueError``
        when the peer sent more than ``MAX_FDS`` descriptors or a line over ``MAX_MESSAGE``
        bytes (the descriptors that came are in ``fds``: the caller closes them)."""
        data, fds, flags, _addr = socket.recv_fds(self.sock, 1 << 16, MAX_FDS)
        self.fds += fds
        if flags & socket.MSG_CTRUNC or len(self.fds) > MAX_FDS:
            raise ValueError(f"more than {MAX_FDS} descriptors")
        if not data:
            return False
        self.buffer += data
        if len(self.buffer) > MAX_MESSAGE and self.buffer.find(b"\n", 0, MAX_MESSAGE + 1) < 0:
            raise ValueError(f"a message longer than {MAX_MESSAGE} bytes")
        return True

    def message(self) -> dict[str, Any] | None:
        """The next whole message in the buffer, or None when no whole line has come yet."""
        line, newline, rest = self.buffer.partition(b"\n")
        if not newline:
            return None
        self.buffer = rest
        if len(line) > MAX_MESSAGE:
            raise ValueError(f"a message longer than {MAX_MESSAGE} bytes")
        try:
            message = json.loads(line)
        except RecursionError:  # nested too deeply for the decoder
            raise ValueError(f"not a message: {line[:100]!r}") from None
        if not isinstance(message, dict):
            raise ValueError(f"not a message: {line[:100]!r}")
        return message

    def close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

"""Listening sockets for TCP stores: bound to the address the peers use, with an allow-list.

torch's ``TCPStore`` server binds every interface whatever host it is given. A store made with
``master_listen_fd`` listens on a socket its maker bound instead: :func:`listening_socket` binds
one to a host's own address (each of a name's addresses in turn) and, given an allow-list,
attaches a classic BPF socket filter that drops every IPv4 packet whose source is not in the list
(SYNs included; accepted connections inherit the filter), and every IPv6 packet. The socket's own
address and loopback always pass.

Used for ft_launcher's rendezvous store (``nvtrain.nvrx.storeguard``) and for the workers' own
stores (``nvtrain.worker.stores``). Imports nothing of nvtrain.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
import struct
from collections.abc import Callable, Iterable

__all__ = [
    "BACKLOG",
    "MAX_NETWORKS",
    "allow_filter",
    "allowed_networks",
    "listening_socket",
]

BACKLOG = 4096
"""The listening socket's backlog (what torch's own listener asks for)."""

_SKF_NET_OFF = -0x100000
"""Classic BPF: loads at this offset read the packet's network (IP) header."""
_LD, _ALU, _JMP, _RET = 0x00, 0x04, 0x05, 0x06
_W, _B, _ABS, _AND, _JEQ = 0x00, 0x10, 0x20, 0x50, 0x10
"""Classic BPF opcodes (linux/filter.h): classes, sizes, modes and operations."""
MAX_NETWORKS = 80
"""The most networks one filter admits (its jumps are 8 bits)."""
_SO_ATTACH_FILTER = 26


def allowed_networks(entries: Iterable[str]) -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of the allow-list ``entries`` (addresses, CIDRs, names resolved here).
    ValueError naming the entry that is none of these or does not resolve."""
    networks: list[ipaddress.IPv4Network] = []
    for entry in entries:
        with contextlib.suppress(ValueError):
            networks.append(ipaddress.IPv4Network(entry, strict=False))
            continue
        try:
            found = socket.getaddrinfo(entry, None, socket.AF_INET, socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise ValueError(
                f"store_allow entry {entry!r} is not an IPv4 address or CIDR and does not resolve: {exc}"
            ) from None
        networks += [ipaddress.IPv4Network(str(info[4][0])) for info in found]
    return networks


def allow_filter(networks: Iterable[ipaddress.IPv4Network]) -> bytes:
    """A classic BPF program (``struct sock_filter`` instructions, 8 bytes each) that keeps the
    IPv4 packets whose source is in ``networks`` and drops every other packet. ValueError when
    there are more networks than its 8-bit jumps can span (``MAX_NETWORKS``)."""
    nets = list(dict.fromkeys(networks))
    if len(nets) > MAX_NETWORKS:
        raise ValueError(f"store_allow names {len(nets)} networks; at most {MAX_NETWORKS} are supported")
    n = len(nets)
    code = [
        (_LD | _B | _ABS, 0, 0, _SKF_NET_OFF),  # the IP header's first byte: its version
        (_ALU | _AND, 0, 0, 0xF0),
        (_JMP | _JEQ, 0, 3 * n, 0x40),  # not IPv4: to the drop
    ]
    for i, net in enumerate(nets):  # three instructions each; a match jumps to the accept
        code += [
            (_LD | _W | _ABS, 0, 0, _SKF_NET_OFF + 12),  # the source address
            (_ALU | _AND, 0, 0, int(net.netmask)),
            (_JMP | _JEQ, 3 * (n - i - 1) + 1, 0, int(net.network_address)),
        ]
    code += [(_RET, 0, 0, 0), (_RET, 0, 0, 0xFFFFFFFF)]  # drop; accept (the whole packet)
    return b"".join(struct.pack("=HBBI", op, jt, jf, k & 0xFFFFFFFF) for op, jt, jf, k in code)


def _attach(sock: socket.socket, program: bytes) -> None:
    import ctypes

    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buffer))
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)  # the kernel copies it


def _own_networks(address: str) -> list[ipaddress.IPv4Network]:
    """Loopback and the socket's own address (an IPv6 socket's v4-mapped form too)."""
    own = [ipaddress.IPv4Network("127.0.0.0/8")]
    with contextlib.suppress(ValueError):
        own.append(ipaddress.IPv4Network(str(ipaddress.ip_address(address))))
    with contextlib.suppress(ValueError):
        mapped = ipaddress.IPv6Address(address).ipv4_mapped
        if mapped is not None:
            own.append(ipaddress.IPv4Network(str(mapped)))
    return own


def listening_socket(
    host: str,
    port: int,
    allow: list[ipaddress.IPv4Network] | None = None,
    *,
    on_wildcard: Callable[[str], None] | None = None,
) -> socket.socket:
    """A socket bound to ``host`` (an address, or each of a name's addresses in turn) and
    ``port``, listening; on every interface when none of the addresses is this node's (then
    ``on_wildcard(host)`` is called). With ``allow``: only IPv4 peers in it (and this socket's
    own address, and loopback) get through; ``[]`` admits this host alone. OSError as
    ``getaddrinfo`` or ``bind`` raises it otherwise (the port in use)."""
    host = host.strip("[]")
    # The allow-list's filter admits IPv4 only: with one, the store listens on IPv4.
    family = socket.AF_UNSPEC if allow is None else socket.AF_INET
    infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    candidates = [(info[0], str(info[4][0])) for info in infos]
    if allow is None:
        candidates.append((socket.AF_INET6, "::"))
    candidates.append((socket.AF_INET, "0.0.0.0"))
    wildcard = False
    for k, (family, address) in enumerate(candidates):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if address == "::":
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((address, port))
        except OSError as exc:
            sock.close()
            last = k == len(candidates) - 1
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) and not last:
                continue
            raise
        wildcard = address in ("::", "0.0.0.0")
        break
    if wildcard and on_wildcard is not None:
        on_wildcard(host)
    try:
        if allow is not None:
            _attach(sock, allow_filter([*_own_networks(address), *allow]))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock

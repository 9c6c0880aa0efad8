"""Free TCP ports for the tests' jobs (rendezvous stores, metrics endpoints, MASTER_PORT).

A port that the kernel picked for ``bind(port 0)`` comes from its ephemeral range, the range it
also takes the local port of every outgoing connection from. Between the test's pick and the
job's bind (seconds on a loaded machine) another connection (gloo's, a store client's, DNS) can
get that very port; the job's store then fails to bind and its peers wait for it until they
time out. The likely cause of two ranks of ``demo_build.py`` stuck for 100 s in the slow suite
under load (their output was lost with the timeout, so it is not proven).

So the ports here are drawn at random from below the ephemeral range (or above it, where it
starts low), where the kernel never hands out a port by itself; only another explicit bind can
take one, and with thousands to draw from, two concurrent tests rarely draw the same.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_FIRST = 10000
"""Lowest port drawn: above the well-known and most registered services."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def _drawable(count: int) -> range:
    low, high = _ephemeral_range()
    if low - _FIRST >= 4096:
        return range(_FIRST, low - count + 1)
    return range(high + 1, 65536 - count + 1)  # the ephemeral range starts low: draw above it


def _free(port: int) -> bool:
    """Nothing is bound to ``port`` on any address (the stores bind every interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def free_port(count: int = 1) -> int:
    """A port P with P .. P + count - 1 all free, outside the kernel's ephemeral range."""
    drawable = _drawable(count)
    draw = random.SystemRandom()  # xdist processes and concurrent suites draw independently
    for _ in range(200):
        port = draw.choice(drawable)
        if all(_free(port + i) for i in range(count)):
            return port
    raise RuntimeError(f"no {count} consecutive free port(s) in {drawable}")


def free_port_pair() -> int:
    """A port P with P and P + 1 free: P hosts the rendezvous store, and NVRx's in-process layer
    puts its own store on MASTER_PORT + 1."""
    return free_port(2)

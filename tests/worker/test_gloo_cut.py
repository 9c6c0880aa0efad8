"""``nvtrain.worker.gloo_cut``: the sockets a process-group creation opened are noted, and cutting
them frees ranks blocked in a gloo collective; nothing else of the process is touched.

Real sockets and real gloo process groups (two ranks as processes); the in-process restart that
uses this, with 2 and 4 ranks under ``nvtrain run``, is in ``test_gloo_inprocess.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.ports import free_port_pair
from support.worker_helpers import BIN, child_env


def _gloo_cut() -> Any:
    # Imported per test: the package imports torch, whose pynvml warning this folder's conftest
    # ignores for test items only, not at collection.
    import nvtrain.worker.gloo_cut as gloo_cut

    return gloo_cut


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    """A listener and a connection to it (both ends)."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    return listener, client, server


def test_only_the_connections_opened_in_the_block_are_cut() -> None:
    GlooLinks = _gloo_cut().GlooLinks
    outside_listener, outside_client, outside_server = _pair()
    outside_listener.close()
    with GlooLinks.noting() as links:
        listener, client, server = _pair()
    try:
        # Both ends of the connection; the listener is not noted (shutting a listener of gloo's
        # down aborts the process).
        assert set(links.sockets) == {client.fileno(), server.fileno()}
        assert links.cut() == 2
        assert client.recv(1) == b""  # shut down: end of stream at once
        assert server.recv(1) == b""
        # The listener still accepts, and the connection made before the block still carries data.
        late = socket.create_connection(listener.getsockname())
        listener.accept()[0].close()
        late.close()
        outside_client.sendall(b"x")
        assert outside_server.recv(1) == b"x"
        assert links.cut() == 0  # a second cut finds nothing left to cut and does not raise
    finally:
        for sock in (listener, client, server, outside_client, outside_server):
            sock.close()


def test_a_descriptor_reused_by_another_socket_is_not_cut() -> None:
    GlooLinks, open_sockets = _gloo_cut().GlooLinks, _gloo_cut().open_sockets
    with GlooLinks.noting() as links:
        listener, client, server = _pair()
    listener.close()
    reused_fd = client.fileno()
    client.close()
    other_listener, other_client, other_server = _pair()
    other_listener.close()
    try:
        # Whatever took the number now is not the noted socket (another inode).
        if other_client.fileno() == reused_fd or other_server.fileno() == reused_fd:
            assert open_sockets()[reused_fd] != links.sockets.get(reused_fd)
        links.cut()
        other_client.sendall(b"y")
        assert other_server.recv(1) == b"y"
    finally:
        for sock in (server, other_client, other_server):
            sock.close()


def test_connections_of_a_store_port_are_never_noted() -> None:
    """A store's server accepts other processes' connections at any time, also while a process
    group is being made: those connections (either end on the store's port) are not the group's,
    and cutting one would stall the restart (NVRx records interruptions in that store)."""
    GlooLinks = _gloo_cut().GlooLinks
    store = socket.create_server(("127.0.0.1", 0))
    port = store.getsockname()[1]
    with GlooLinks.noting(exclude_ports={port}) as links:
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = store.accept()
        unix_a, unix_b = socket.socketpair()
        listener, gloo_client, gloo_server = _pair()
    try:
        assert set(links.sockets) == {gloo_client.fileno(), gloo_server.fileno()}
        assert links.cut() == 2
        client.sendall(b"z")
        assert accepted.recv(1) == b"z"
        unix_a.sendall(b"u")
        assert unix_b.recv(1) == b"u"
    finally:
        for sock in (store, client, accepted, unix_a, unix_b, listener, gloo_client, gloo_server):
            sock.close()


def test_noting_off_notes_nothing() -> None:
    GlooLinks = _gloo_cut().GlooLinks
    with GlooLinks.noting(enabled=False) as links:
        listener, client, server = _pair()
    assert links.sockets == {} and links.cut() == 0
    for sock in (listener, client, server):
        sock.close()


def test_a_rank_blocked_in_a_gloo_collective_is_freed_when_its_peer_cuts(tmp_path: Path) -> None:
    """Rank 0 waits in all_reduce with a 300 s timeout; rank 1 cuts instead of joining. Without
    the cut rank 0 would wait until rank 1 exits (which waits for rank 0): the test would hang
    and fail at its timeout."""
    port = free_port_pair()
    script = str(BIN / "gloo_cut_ranks.py")
    env = child_env()
    env["PYTHONWARNINGS"] = "ignore"
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(rank), str(port)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    text = "\n".join(outputs)
    assert [proc.returncode for proc in procs] == [0, 0], text
    assert "RANK 1: cut 1" in text, text  # its one connection (to rank 0), not its listener
    assert "RANK 0: freed after" in text and "Connection closed by peer" in text, text

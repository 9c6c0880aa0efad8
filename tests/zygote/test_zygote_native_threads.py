"""The warm-start server's fork check sees native threads, which ``threading`` does not: a real
server whose script's imports start a thread through ``pthread_create`` (no Python in it)
refuses to serve, says so in one line, and its client starts cold. The thread pool that
OpenBLAS starts as ``import torch`` loads numpy is known, and fork-safe: a script that uses
numpy is still served warm."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from zygote_helpers import SERVER_READY, start_client, start_server, stop_server

from support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NATIVE = textwrap.dedent(
    """
    import ctypes, threading
    libc = ctypes.CDLL(None)
    thread = ctypes.c_ulong()
    # A thread that runs libc's sleep(3600): C only, so threading never hears of it.
    start = ctypes.cast(libc.sleep, ctypes.c_void_p)
    assert libc.pthread_create(ctypes.byref(thread), None, start, ctypes.c_void_p(3600)) == 0
    assert threading.active_count() == 1
    """
)

SCRIPT = textwrap.dedent(
    """
    import sys
    warm = "torch" in sys.modules  # imported by the server before the fork, not by this script
    import {helper}
    print(f"warm={{warm}}", flush=True)
    """
)


def _server_of(tmp_path: Path, helper: str, source: str) -> Path:
    (tmp_path / f"{helper}.py").write_text(source, encoding="utf-8")
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT.format(helper=helper), encoding="utf-8")
    return script


def test_a_native_thread_started_by_an_import_turns_warm_starts_off(tmp_path: Path) -> None:
    script = _server_of(tmp_path, "native_helper", NATIVE)
    proc, socket_path = start_server(tmp_path, script)
    log = tmp_path / "zygote.sock.log"
    try:
        said = wait_until(
            lambda: [line for line in log.read_text().splitlines() if "warm start" in line],
            SERVER_READY,
            "the server's word on its imports",
            alive=lambda: proc.poll() is None,
            detail=log.read_text,
        )
        assert len(said) == 1, said
        assert "off, workers start cold" in said[0] and "1 native thread" in said[0], said
        assert not socket_path.exists()
        with start_client(script, socket_path=socket_path, cwd=tmp_path) as client:
            out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err
        assert "warm=False" in out, out + err
    finally:
        stop_server(proc)


def test_openblas_threads_of_the_base_imports_do_not_turn_warm_starts_off(tmp_path: Path) -> None:
    uses_numpy = "import numpy\nnumpy.ones((64, 64)) @ numpy.ones((64, 64))\n"
    script = _server_of(tmp_path, "numpy_helper", uses_numpy)
    proc, socket_path = start_server(tmp_path, script)
    log = tmp_path / "zygote.sock.log"
    try:
        # A client that comes during the server's imports waits for them in the socket's queue.
        wait_until(socket_path.exists, SERVER_READY, "the server's socket", alive=lambda: proc.poll() is None)
        with start_client(script, socket_path=socket_path, cwd=tmp_path) as client:
            out, err = client.communicate(timeout=180)
        assert client.returncode == 0, err
        assert "warm=True" in out, out + err + log.read_text()
        assert "warm start" not in log.read_text(), log.read_text()
    finally:
        stop_server(proc)

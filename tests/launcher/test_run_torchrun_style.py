"""``nvtrain run`` used as torchrun, under the real ft_launcher (NVRx 0.4.1 on CPU): one-node jobs
side by side on free ports, ``nvtrain run --nproc-per-node 2 train.py ARGS`` with a plain gloo
DDP script, ft_launcher's log options, and an explicit busy port (exit 2).

The command lines themselves (every flag, through ``--dry-run``): tests/cli/test_run_torchrun_flags.py.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.proc_helpers import BIN, NvtrainRunner, make_policy, read_events, write_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

DDP = str(BIN / "ddp_train.py")


def _endpoint(run_dir: Path) -> str:
    starts = [e for e in read_events(run_dir) if e["event"] == "launcher_start"]
    assert starts, run_dir
    return str(starts[0]["endpoint"])


def test_two_one_node_jobs_without_a_port_run_side_by_side(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    # Each job's worker waits until the other job's worker has started: both ft_launchers (and
    # their rendezvous stores) run at once. On one port, the second store could not listen.
    meet = tmp_path / "meet"
    meet.mkdir()
    _, tables = make_policy(
        tmp_path, script=str(BIN / "meet_worker.py"), args=[str(meet), "a", "b"], nproc=1, max_restarts=0
    )
    del tables["rendezvous"]["port"]  # a one-node policy without a port
    policy = write_policy(tmp_path, tables)
    first = nvtrain.start("--run-id", "side-a", str(policy))
    # The script form: no policy at all.
    second = nvtrain.start(
        "--run-id", "side-b", "--max-restarts", "0", str(BIN / "meet_worker.py"), str(meet), "b", "a"
    )
    assert first.wait(timeout=180) == 0, first.describe()
    assert second.wait(timeout=180) == 0, second.describe()
    assert "MET a b" in first.stdout, first.describe()
    assert "MET b a" in second.stdout, second.describe()
    ports = {
        _endpoint(tmp_path / "ckpt" / "side-a"),
        _endpoint(nvtrain.tmpdir / "nvtrain" / "side-b"),  # $TMPDIR/nvtrain
    }
    assert len(ports) == 2 and all(p.startswith("127.0.0.1:") for p in ports), ports
    assert "127.0.0.1:29500" not in ports


def test_a_torchrun_script_with_its_arguments(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    run = nvtrain.start("--nproc-per-node", "2", DDP, "--steps", "3", "--foo", "bar")
    assert run.wait(timeout=180) == 0, run.describe()
    out = run.stdout
    started = re.findall(r"DDP ARGS (\[.*?\]) RANK=(\d) WORLD_SIZE=(\d)", out)
    assert sorted(rank for _, rank, _ in started) == ["0", "1"], run.describe()
    for args, _, world in started:
        assert json.loads(args) == ["--steps", "3", "--foo", "bar"]
        assert world == "2"
    done = re.findall(r"DDP DONE RANK=(\d) steps=3 weight=(\S+)", out)
    assert sorted(rank for rank, _ in done) == ["0", "1"], run.describe()
    assert len({weight for _, weight in done}) == 1, done  # DDP kept the ranks in step
    assert "Traceback" not in run.stderr


def test_ranks_that_finished_end_their_run_even_if_the_interpreters_exit_would_abort(
    nvtrain: NvtrainRunner,
) -> None:
    # Both ranks finish; a module of theirs keeps an object whose freeing at the interpreter's
    # exit aborts the process, as torch's gloo objects can after destroy_process_group. Run as
    # ``python SCRIPT``, each rank would die of SIGABRT after its last line and ft_launcher
    # would restart the group for a run that was over; nvtrain.entry ends them without that.
    run = nvtrain.start("--nproc-per-node", "2", str(BIN / "ending_worker.py"), "abort")
    assert run.wait(timeout=180) == 0, run.describe()
    started = re.findall(r"ENDING START mode=abort rank=(\d)", run.stdout)
    assert sorted(started) == ["0", "1"], run.describe()  # once each: no restart
    assert run.stdout.count("ENDING DONE") == 2, run.describe()
    assert "SIGABRT" not in run.stderr, run.describe()


def test_log_options_reach_ft_launcher(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    # --tee 3 writes every rank's output to --log-dir and shows it; --local-ranks-filter 0 shows
    # only local rank 0's on the console.
    logs = tmp_path / "logs"
    noop = str(BIN / "noop_worker.py")
    run = nvtrain.start(
        "--nproc_per_node=2", "--tee", "3", "--log-dir", str(logs), "--local-ranks-filter", "0", noop, "--x"
    )
    assert run.wait(timeout=180) == 0, run.describe()
    assert "WORKER RAN rank=0 args=['--x']" in run.stdout, run.describe()
    assert "WORKER RAN rank=1" not in run.stdout, run.describe()
    written = "".join(p.read_text(errors="replace") for p in logs.rglob("stdout.log"))
    assert "WORKER RAN rank=0" in written and "WORKER RAN rank=1" in written, written


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another program listens on (every IPv4 address), for as long as the test runs."""
    with socket.create_server(("0.0.0.0", 0)) as server:
        yield int(server.getsockname()[1])


def test_an_explicit_busy_port_is_exit_2_naming_the_key(
    nvtrain: NvtrainRunner, tmp_path: Path, busy_port: int
) -> None:
    policy, _ = make_policy(tmp_path, script=str(BIN / "noop_worker.py"), nproc=1, port=busy_port)
    in_file = nvtrain.start("--run-id", "busy-1", str(policy))
    by_flag = nvtrain.start("--master-port", str(busy_port), str(BIN / "noop_worker.py"))
    for run in (in_file, by_flag):
        assert run.wait(timeout=60) == 2, run.describe()
        assert f"[rendezvous] port = {busy_port} is in use" in run.stderr, run.describe()
        assert not run.launcher_seen(), run.describe()
        assert "WORKER RAN" not in run.stdout

"""Warm start for a torchrun script run the torchrun way: a plain script (no nvtrain import)
starts warm by default, and cold with ``--no-warm-start`` or ``warm_start = false`` in its policy
(scripts of the worker library start warm by default too: the fault matrix and recovery tests);
a DDP script's workers end once it is over (its model's gloo group is not freed under the
interpreter, where that could deadlock); where the server refuses
(an import of the script starts a thread), the workers start cold, the run is the same, and one
line says why.

Real ``nvtrain run`` (ft_launcher, 2 ranks, gloo) of a standard torchrun script; a worker knows
it was forked by the server from ``NVTRAIN_PID`` (its client's pid, set only for warm workers)
and from its parent process (the server, not ft_launcher's client).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.proc_helpers import BIN, NvtrainRunner

pytestmark = pytest.mark.slow

SCRIPT = """\
import os
import psutil
import torch.distributed as dist
{extra}
dist.init_process_group("gloo")
dist.barrier()
parent = psutil.Process().parent()
line = (
    f"WORKER rank={{dist.get_rank()}} warm={{'NVTRAIN_PID' in os.environ}} "
    f"parent={{' '.join(parent.cmdline()[1:3]) if parent else None}}\\n"
)
os.write(1, line.encode())  # one write: the two ranks share the pipe (print writes twice)
dist.destroy_process_group()
"""


COLD_POLICY = '[job]\nname = "cold"\nscript = "train.py"\nwarm_start = false\n'


def _run(nvtrain: NvtrainRunner, tmp_path: Path, extra: str = "", *flags: str) -> tuple[str, str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(extra=extra), encoding="utf-8")
    (tmp_path / "cold.toml").write_text(COLD_POLICY, encoding="utf-8")
    run = nvtrain.start("--nproc-per-node", "2", *flags, str(script))
    assert run.wait(timeout=120) == 0, run.describe()
    return run.stdout, run.stderr


def _workers(out: str) -> list[tuple[str, str, str]]:
    return sorted(re.findall(r"WORKER rank=(\d) warm=(\w+) parent=(.*)", out))


def test_a_torchrun_script_is_forked_warm_by_default(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    out, err = _run(nvtrain, tmp_path, "")
    assert _workers(out) == [(r, "True", "-m nvtrain.zygote.server") for r in ("0", "1")], out + err
    assert "warm start: off" not in err


def test_a_deep_tmpdir_and_a_long_name_still_start_warm(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    # The server's socket lies in the state folder under $TMPDIR, named for the run id: here its
    # path is well over the 107 bytes a socket address holds (it was "AF_UNIX path too long",
    # a traceback, and every worker cold without a word).
    deep = nvtrain.tmpdir / ("t" * 60) / ("u" * 60)
    deep.mkdir(parents=True, mode=0o700)
    script = tmp_path / ("a_training_script_with_a_long_name" + "_x" * 8 + ".py")
    script.write_text(SCRIPT.format(extra=""), encoding="utf-8")
    run = nvtrain.start("--nproc-per-node", "2", str(script), env={"TMPDIR": str(deep)})
    assert run.wait(timeout=120) == 0, run.describe()
    warm = [(r, "True", "-m nvtrain.zygote.server") for r in ("0", "1")]
    assert _workers(run.stdout) == warm, run.describe()
    assert "warm start" not in run.stderr and "Traceback" not in run.stderr, run.describe()


def test_a_warm_ddp_script_ends_when_it_is_over(nvtrain: NvtrainRunner) -> None:
    # DDP's reducer holds the gloo group (after destroy_process_group too): freed when the
    # script returned, its destructor could wait for a gloo thread that waited for the GIL the
    # destructor held (2 runs of 6 under stress-ng; the script's globals are kept now).
    for _ in range(4):
        run = nvtrain.start("--nproc-per-node", "2", str(BIN / "ddp_train.py"), "--steps", "3")
        assert run.wait(timeout=120) == 0, run.describe()
        assert sorted(re.findall(r"DDP DONE RANK=(\d)", run.stdout)) == ["0", "1"], run.describe()
        assert "warm start: off" not in run.stderr, run.describe()


@pytest.mark.parametrize(
    "flags", [("--no-warm-start",), ("--policy", "cold.toml")], ids=["no-warm-start", "warm_start-false"]
)
def test_a_plain_script_opted_out_runs_every_worker_as_a_new_interpreter(
    nvtrain: NvtrainRunner, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    flags = tuple(str(tmp_path / f) if f.endswith(".toml") else f for f in flags)
    out, err = _run(nvtrain, tmp_path, "", *flags)
    workers = _workers(out)
    assert [(r, warm) for r, warm, _ in workers] == [("0", "False"), ("1", "False")], out + err
    assert all("nvtrain.zygote.client" not in parent for _, _, parent in workers), workers


def test_where_forking_is_unsafe_the_workers_start_cold_and_one_line_says_why(
    nvtrain: NvtrainRunner, tmp_path: Path
) -> None:
    (tmp_path / "threaded_helper.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n",
        encoding="utf-8",
    )
    out, err = _run(nvtrain, tmp_path, "import threaded_helper")
    workers = _workers(out)
    assert [(r, warm) for r, warm, _ in workers] == [("0", "False"), ("1", "False")], out + err
    lines = [line for line in err.splitlines() if "warm start" in line]
    assert len(lines) == 1, err
    assert "off, workers start cold" in lines[0] and "started threads" in lines[0], lines
    assert "[job] warm_start = false" in lines[0], lines

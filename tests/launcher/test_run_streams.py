"""What ``nvtrain run`` prints, under the real ft_launcher (NVRx 0.4.1 on CPU): the workers'
stdout on nvtrain's stdout and their stderr on its stderr; ft_launcher's own INFO lines only in
``<run dir>/launcher-node0.log`` (and on the terminal with ``verbose``), its warnings shown."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.proc_helpers import BIN, NvtrainRunner, make_policy

pytestmark = pytest.mark.slow


def test_stderr_stays_stderr_and_the_launchers_chatter_goes_to_its_log(
    nvtrain: NvtrainRunner, tmp_path: Path
) -> None:
    policy, _ = make_policy(tmp_path, script=str(BIN / "streams_worker.py"))
    run = nvtrain.start(str(policy), env={"NVTRAIN_RUN_ID": "streams-1"})
    assert run.wait(timeout=90) == 0, run.describe()
    out, err = run.stdout, run.stderr
    for rank in (0, 1):
        assert f"STREAM OUT rank={rank}\n" in out and f"STREAM OUT rank={rank}" not in err, run.describe()
        assert f"STREAM ERR rank={rank}\n" in err and f"STREAM ERR rank={rank}" not in out, run.describe()
        assert f"[rank{rank}] [INFO] step 1 STREAM OWN LOG rank={rank}\n" in err, run.describe()
    # ft_launcher's INFO lines and its launch configuration table: in its log, not shown
    log = (tmp_path / "ckpt" / "streams-1" / "launcher-node0.log").read_text(encoding="utf-8")
    for text in ("Using nproc_per_node=2", "rdzv_endpoint    :", "has joined round 0 of the rendezvous"):
        assert text in log, log
        assert text not in out + err, run.describe()
    assert not re.search(r"\[INFO\] \[ft_launcher", out + err), run.describe()
    assert "STREAM" not in log  # no worker line in the launcher's log
    # nvtrain's own event lines are as before
    assert re.search(r"^nvtrain: \d\d:\d\d:\d\d event=launcher_exit exit_code=0 ", err, re.M), run.describe()

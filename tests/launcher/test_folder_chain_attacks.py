"""Issue 51: a folder above the run's folder that another user owns, and the defaults in ``/tmp``.

The attacker is the user ``nobody`` (uid 65534), acting through ``setpriv``, in folders every
user may write (sticky, 1777, as ``/tmp`` is). Three attacks, each with a real ``nvtrain run``:

- ``[checkpoint] dir`` under a folder of nobody's: nobody could rename the run's folder away at
  any time and put their own in its place, so the start is refused with exit 2, naming that
  folder, its owner and the fix, and nothing is made in it.
- The folder above goes bad mid-run (it becomes nobody's after the step-20 checkpoint), and
  nobody swaps the run's folder for their own, with ``events-node0.jsonl`` linked to a file only
  root may write: no event line reaches that file, no checkpoint lands in nobody's folder, and
  the run says why on stderr.
- ``$TMPDIR/nvtrain`` (the script form's default ``[checkpoint] dir``) made first by nobody: the
  run goes on in a fresh folder of this user's beside it and says so; nobody's is untouched.

Acting as another user needs root; elsewhere these tests are skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.proc_helpers import BIN, NvtrainRunner, _not_here, make_policy, read_events, write_policy
from support.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:The pynvml package is deprecated:FutureWarning"),
]

NOBODY = 65534
SECRET = b"root's own file\n"


@pytest.fixture
def shared() -> Iterator[Path]:
    """``t`` (the run's TMPDIR), ``shm`` (its memory_dir) and ``ckpt``: folders every user may
    write, in a short folder of /tmp that every user may enter, beside ``secret`` (root's, 0600)."""
    if os.geteuid() != 0:
        _not_here("acting as another user (nobody) needs root")
    if shutil.which("setpriv") is None:
        _not_here("needs setpriv (util-linux) to act as another user")
    root = Path(tempfile.mkdtemp(prefix="nvt-anc-", dir="/tmp"))
    try:
        root.chmod(0o755)
        for name in ("t", "shm", "ckpt"):
            (root / name).mkdir()
            (root / name).chmod(0o1777)
        (root / "secret").write_bytes(SECRET)
        (root / "secret").chmod(0o600)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def as_nobody(script: str) -> None:
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-ec", script]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr


def tree(path: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every entry under ``path``, links not followed: type and mode, owner, contents."""
    found = {}
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            entry = Path(root) / name
            info = os.lstat(entry)
            data = entry.read_bytes() if stat.S_ISREG(info.st_mode) else None
            if stat.S_ISLNK(info.st_mode):
                data = os.readlink(entry).encode()
            found[str(entry.relative_to(path))] = (info.st_mode, info.st_uid, data)
    return found


def test_a_checkpoint_dir_under_another_users_folder_is_refused_naming_that_folder(
    nvtrain: NvtrainRunner, tmp_path: Path, shared: Path
) -> None:
    above = shared / "ckpt" / "nbp"
    as_nobody(f"mkdir -m 755 '{above}'")
    _, tables = make_policy(tmp_path, script=str(BIN / "noop_worker.py"), nproc=1, max_restarts=0)
    tables["checkpoint"] = {"dir": str(above / "ck"), "memory_dir": str(shared / "shm")}
    run = nvtrain.start(
        "--run-id", "under-theirs", str(write_policy(tmp_path, tables)), env={"TMPDIR": str(shared / "t")}
    )
    assert run.wait(timeout=60) == 2, run.describe()
    err = run.stderr
    assert (
        f'[checkpoint] dir = "{above / "ck"}": the run\'s folder {above / "ck" / "under-theirs"} is under '
        f"{above} (mode 0755), which belongs to uid 65534 (nobody)"
    ) in err, run.describe()
    assert f"fix: make {above} root's or this user's (chown)" in err, run.describe()
    assert "Traceback" not in err + run.stdout and not run.launcher_seen(), run.describe()
    assert tree(above) == {}  # nothing made in nobody's folder
    assert list((shared / "t").iterdir()) == []  # and no state folder left


def test_a_run_folder_swapped_mid_run_gets_no_more_events_or_checkpoints(
    nvtrain: NvtrainRunner, tmp_path: Path, shared: Path
) -> None:
    above = shared / "ckpt" / "nbp"
    above.mkdir(mode=0o755)  # root's: safe when the run starts
    gate = tmp_path / "gate"
    gate.mkdir()
    run_id = "swapped"
    args = ["--steps", "100", "--gate", str(gate), "--gate-step", "20"]
    _, tables = make_policy(
        tmp_path, script=str(BIN / "gated_ckpt_worker.py"), args=args, nproc=1, max_restarts=0
    )
    tables["checkpoint"] = {
        "dir": str(above / "ck"),
        "memory_dir": str(shared / "shm"),
        "interval": 20,
        "keep": 10,
    }
    run = nvtrain.start(
        "--run-id", run_id, str(write_policy(tmp_path, tables)), env={"TMPDIR": str(shared / "t")}
    )
    ours = above / "ck" / run_id

    def committed(folder: Path) -> list[int]:
        return [int(e["step"]) for e in read_events(folder) if e["event"] == "checkpoint_committed"]

    wait_until(
        lambda: (gate / "reached").exists() and committed(ours) == [20],
        120,
        "the step-20 checkpoint committed and the worker at its gate",
        alive=lambda: run.proc.poll() is None,
    )
    # The folder above becomes nobody's; nobody swaps the run's folder for their own and links
    # its events log to a file only root may write.
    os.chown(above, NOBODY, NOBODY)
    secret = shared / "secret"
    as_nobody(
        f"cd '{above}'; mv ck ck.old; mkdir -p ck/{run_id}; ln -s '{secret}' ck/{run_id}/events-node0.jsonl"
    )
    theirs = tree(above / "ck")
    (gate / "go").touch()
    code = run.wait(timeout=120)

    assert secret.read_bytes() == SECRET, run.describe()  # no event line appended to root's file
    assert tree(above / "ck") == theirs, run.describe()  # nothing written into nobody's folder
    kept = above / "ck.old" / run_id  # our own folder, renamed away: no checkpoint after the swap
    assert sorted(p.name for p in kept.iterdir() if p.name.startswith("step-")) == ["step-000020"]
    assert committed(kept) == [20], run.describe()
    out = run.stdout + run.stderr
    assert "Traceback" not in out, run.describe()
    assert "GATED DONE step=100" in run.stdout, run.describe()
    # Each later save is dropped, saying why; the events log says once why it writes no more.
    said = re.findall(r"checkpoint of step (\d+) not saved", run.stderr)
    assert sorted(set(map(int, said))) == [40, 60, 80, 100], run.describe()
    assert "which belongs to uid 65534 (nobody)" in run.stderr, run.describe()
    assert "is not the folder this events log was opened in any more" in run.stderr, run.describe()
    assert code == 0, run.describe()  # training went on to its end, without checkpoints


@pytest.mark.parametrize("mode", [0o755, 0o777])
def test_a_tmpdir_nvtrain_another_user_made_first_gives_way_to_a_fresh_folder(
    nvtrain: NvtrainRunner, shared: Path, mode: int
) -> None:
    tmpdir = shared / "t"
    taken = tmpdir / "nvtrain"
    as_nobody(f"mkdir -m {mode:o} '{taken}'; echo planted > '{taken}/planted'")
    before = tree(taken)
    run = nvtrain.start(
        "--run-id",
        "script-form",
        "--nproc-per-node",
        "1",
        str(BIN / "noop_worker.py"),
        env={"TMPDIR": str(tmpdir)},
    )
    assert run.wait(timeout=90) == 0, run.describe()
    assert "WORKER RAN" in run.stdout and "Traceback" not in run.stderr, run.describe()
    found = re.search(
        rf"nvtrain: note: {re.escape(str(taken))} belongs to uid 65534 \(nobody\); this run keeps its "
        rf"checkpoints in a fresh folder of this user's, ({re.escape(str(tmpdir))}/nvtrain-0-[0-9a-f]{{12}})",
        run.stderr,
    )
    assert found is not None, run.describe()
    fresh = Path(found.group(1))
    assert tree(taken) == before  # nobody's folder as it was: nothing made or written in it
    info = os.lstat(fresh / "script-form")
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o700
    assert (fresh / "script-form" / "events-node0.jsonl").is_file()

"""Nobody else's folders: ``nvtrain run`` against another local user who got there first.

The attacker is the user ``nobody`` (uid 65534), acting through ``setpriv``, in folders that
every user may write (sticky, 1777, as ``/tmp`` and ``/dev/shm`` are). The state folder and the
host-copy folder are named after the launcher's pid and a random part; to plant them at the
names a run would have used before the random part, the test starts a wrapper that stops itself
(SIGSTOP) and then execs ``nvtrain run`` (exec keeps the pid): with the wrapper stopped,
``nobody`` makes the folders, then the wrapper goes on (SIGCONT); the run must go on in fresh
folders of its own, touching nothing of nobody's. A run folder that is nobody's or open to writes
is refused with exit 2 and a message that names the path, the variable or key behind it, what is
wrong and the fix; nvtrain uses and removes nothing of nobody's, and leaves nothing of its own
(no state folder, no run folder on the checkpoint volume). A normal run gives ft_launcher a
private TMPDIR (NVRx's sockets, torch elastic's log folder), removed at the end, hands the workers
the run's key file (0600) and the script the user's own TMPDIR; cold and warm workers alike.

Acting as another user needs root; elsewhere these tests are skipped (failed in CI, which sets
NVTRAIN_MULTINODE=require).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.proc_helpers import BIN, NvtrainRunner, Running, _not_here, make_policy, write_policy

pytestmark = pytest.mark.slow

NOBODY = 65534
# Stops itself, then becomes `nvtrain run ...` under the same pid.
STOP_THEN_EXEC = [
    sys.executable,
    "-c",
    "import os, signal, sys; os.kill(os.getpid(), signal.SIGSTOP); os.execv(sys.argv[1], sys.argv[1:])",
]


@pytest.fixture
def shared() -> Iterator[Path]:
    """``t`` (the run's TMPDIR), ``shm`` (its memory_dir) and ``ckpt`` (its checkpoint dir):
    folders every user may write, in a short folder of /tmp that every user may enter."""
    if os.geteuid() != 0:
        _not_here("acting as another user (nobody) needs root")
    if shutil.which("setpriv") is None:
        _not_here("needs setpriv (util-linux) to act as another user")
    root = Path(tempfile.mkdtemp(prefix="nvt-", dir="/tmp"))
    try:
        root.chmod(0o755)
        for name in ("t", "shm", "ckpt"):
            (root / name).mkdir()
            (root / name).chmod(0o1777)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def as_nobody(script: str) -> None:
    """Run the shell ``script`` as the user nobody."""
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-ec", script]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr


def plant(path: Path, form: str) -> None:
    """Make ``path`` as nobody: a folder open to all (``open``), a link to a folder of nobody's
    elsewhere (``link``), or a folder of nobody's at 0700 (``nobody's``); a file in each."""
    p = f"'{path}'"
    if form == "open":
        as_nobody(f"mkdir -m 0777 {p}; echo planted > {p}/planted")
    elif form == "link":
        target = f"'{path.parent}/elsewhere-{path.name}'"
        as_nobody(f"mkdir -m 0777 {target}; echo planted > {target}/planted; ln -s {target} {p}")
    else:
        as_nobody(f"mkdir -m 0700 {p}; echo planted > {p}/planted")


def tree(path: Path) -> dict[str, tuple[int, int, int, bytes | None]]:
    """Every entry under ``path``, links not followed: type and mode, owner, group, contents."""
    found = {}
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            entry = Path(root) / name
            info = os.lstat(entry)
            data = entry.read_bytes() if stat.S_ISREG(info.st_mode) else None
            if stat.S_ISLNK(info.st_mode):
                data = os.readlink(entry).encode()
            found[str(entry.relative_to(path))] = (info.st_mode, info.st_uid, info.st_gid, data)
    return found


def _policy(tmp_path: Path, shared: Path) -> Path:
    _, tables = make_policy(tmp_path, script=str(BIN / "noop_worker.py"), nproc=1, max_restarts=0)
    tables["checkpoint"] = {"dir": str(shared / "ckpt"), "memory_dir": str(shared / "shm")}
    return write_policy(tmp_path, tables)


def _refused(run: Running, *texts: str) -> None:
    assert run.wait(timeout=60) == 2, run.describe()
    err = run.stderr
    for text in texts:
        assert text in err, run.describe()
    assert "fix: remove" in err and "Traceback" not in err + run.stdout, run.describe()
    assert not run.launcher_seen(), run.describe()


@pytest.mark.parametrize("form", ["open", "link", "nobody's"])
def test_folders_another_user_made_at_the_pid_names_are_left_alone_and_the_run_goes_on(
    nvtrain: NvtrainRunner, tmp_path: Path, shared: Path, form: str
) -> None:
    """Before the random part (issue 51), a state or host-copy folder that nobody made first at
    ``nvtrain-<run id>-node<N>-<pid>`` stopped the start with exit 2; now those names are never
    used: the run finishes in folders of its own, and nobody's are as they were."""
    run_id = "attacked"
    policy = _policy(tmp_path, shared)
    run = nvtrain.start(
        "--run-id", run_id, str(policy), env={"TMPDIR": str(shared / "t")}, prefix=STOP_THEN_EXEC
    )
    _, status = os.waitpid(run.pid, os.WUNTRACED)  # until the wrapper has stopped itself
    assert os.WIFSTOPPED(status), status
    name = f"nvtrain-{run_id}-node0-{run.pid}"  # the names this run would have used
    for folder in (shared / "t", shared / "shm"):
        plant(folder / name, form)
    before = {folder: tree(folder) for folder in (shared / "t", shared / "shm")}
    os.kill(run.pid, signal.SIGCONT)

    assert run.wait(timeout=120) == 0, run.describe()
    assert "Traceback" not in run.stderr + run.stdout, run.describe()
    # nobody's folders, files and links as they were: nothing used, nothing removed; and nothing
    # of nvtrain's left in them (its own state and host-copy folders went at the end).
    assert {folder: tree(folder) for folder in before} == before
    assert list(Path("/tmp").glob(f"nvtrain-{run.pid}-*")) == []


@pytest.mark.parametrize(
    ("owner", "mode", "reason"),
    [
        ("nobody", 0o700, "belongs to uid 65534 (nobody)"),
        ("nobody", 0o777, "belongs to uid 65534 (nobody)"),
        ("root", 0o777, "has mode 0777"),
        ("root", 0o775, "has mode 0775"),
    ],
)
def test_a_run_folder_of_another_user_or_open_to_writes_is_refused(
    nvtrain: NvtrainRunner, tmp_path: Path, shared: Path, owner: str, mode: int, reason: str
) -> None:
    run_id = "taken"
    run_dir = shared / "ckpt" / run_id
    if owner == "nobody":
        as_nobody(f"mkdir -m {mode:o} '{run_dir}'; echo planted > '{run_dir}/events-node0.jsonl'")
    else:
        run_dir.mkdir()
        run_dir.chmod(mode)
    before = tree(shared)
    run = nvtrain.start("--run-id", run_id, str(_policy(tmp_path, shared)), env={"TMPDIR": str(shared / "t")})
    _refused(run, f'[checkpoint] dir = "{shared / "ckpt"}": the run\'s folder {run_dir} {reason}')
    assert tree(shared) == before


def test_a_checkpoint_dir_anyone_may_write_without_the_sticky_bit_is_refused(
    nvtrain: NvtrainRunner, tmp_path: Path, shared: Path
) -> None:
    """The default for scripts is ``$TMPDIR/nvtrain``: a user who made it first, open to all and
    not sticky, could rename our run folder away and put their own in its place."""
    parent = shared / "ckpt" / "nvtrain"
    as_nobody(f"mkdir -m 0777 '{parent}'")
    _, tables = make_policy(tmp_path, script=str(BIN / "noop_worker.py"), nproc=1, max_restarts=0)
    tables["checkpoint"] = {"dir": str(parent), "memory_dir": str(shared / "shm")}
    before = tree(shared)
    run = nvtrain.start(
        "--run-id", "open-parent", str(write_policy(tmp_path, tables)), env={"TMPDIR": str(shared / "t")}
    )
    assert run.wait(timeout=60) == 2, run.describe()
    assert (
        f"the run's folder {parent / 'open-parent'} is in {parent} (mode 0777), which anyone may write"
        in run.stderr
    )
    assert f"fix: give {parent} the sticky bit" in run.stderr, run.describe()
    assert "Traceback" not in run.stderr + run.stdout and not run.launcher_seen(), run.describe()
    assert tree(shared) == before


def test_an_unusable_memory_dir_leaves_no_run_folder(nvtrain: NvtrainRunner, tmp_path: Path) -> None:
    _, tables = make_policy(tmp_path, script=str(BIN / "noop_worker.py"), nproc=1)
    tables["checkpoint"]["memory_dir"] = str(tmp_path / "no-such-shm")
    run = nvtrain.start("--run-id", "no-shm", str(write_policy(tmp_path, tables)))
    assert run.wait(timeout=60) == 2, run.describe()
    assert f'[checkpoint] memory_dir = "{tmp_path / "no-such-shm"}": cannot make the folder' in run.stderr
    assert not run.launcher_seen(), run.describe()
    assert list((tmp_path / "ckpt").iterdir()) == []  # the run folder this start made is gone
    assert list(nvtrain.tmpdir.iterdir()) == []


REPORT = """
import json, os, stat, sys, tempfile
def look(path):
    info = os.lstat(path)
    return {"path": path, "mode": stat.S_IMODE(info.st_mode), "uid": info.st_uid, "size": info.st_size,
            "folder_mode": stat.S_IMODE(os.lstat(os.path.dirname(path)).st_mode)}
report = {
    "TMPDIR": os.environ.get("TMPDIR"), "gettempdir": tempfile.gettempdir(),
    "key": look(os.environ["NVTRAIN_RUN_KEY_FILE"]) if "NVTRAIN_RUN_KEY_FILE" in os.environ else None,
    "socket": look(os.environ["FT_LAUNCHER_IPC_SOCKET"]),
    "rank_monitor": look(os.environ["FT_RANK_MONITOR_IPC_SOCKET"]),
    "forked": "torch" in sys.modules,  # a warm worker's server imported it; nothing here does
}
with open(sys.argv[1], "w") as out:
    json.dump(report, out)
"""


@pytest.mark.parametrize("case", ["cold", "warm", "long TMPDIR"])
def test_a_run_keeps_its_sockets_and_key_private_and_leaves_nothing_in_tmpdir(
    nvtrain: NvtrainRunner, tmp_path: Path, case: str
) -> None:
    """``long TMPDIR``: ``<state folder>/tmp`` would be too long for NVRx's socket paths; ft_launcher
    gets a private folder of a random name in /tmp instead (never /tmp itself)."""
    warm = case == "warm"
    script = tmp_path / "report.py"
    script.write_text(REPORT, encoding="utf-8")
    report = tmp_path / "report.json"
    _, tables = make_policy(tmp_path, script=str(script), args=[str(report)], nproc=1, warm_start=warm)
    tables["checkpoint"]["memory_dir"] = str(tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    tmpdir = nvtrain.tmpdir
    if case == "long TMPDIR":
        tmpdir = nvtrain.tmpdir / ("long-" * 12)
        tmpdir.mkdir()
    run_id = f"private-{case.split()[0]}"
    run = nvtrain.start("--run-id", run_id, str(write_policy(tmp_path, tables)), env={"TMPDIR": str(tmpdir)})
    assert run.wait(timeout=100) == 0, run.describe()

    seen = json.loads(report.read_text(encoding="utf-8"))
    assert seen["forked"] == warm, seen
    key = seen["key"]
    assert key is not None, seen
    state = Path(key["path"]).parent  # nvtrain-<run id>-node0-<pid>-<random>
    assert state.parent == tmpdir and re.fullmatch(
        rf"nvtrain-{run_id}-node0-{run.pid}-[0-9a-f]{{8}}", state.name
    )
    # The script has the user's TMPDIR, not ft_launcher's.
    assert seen["TMPDIR"] == seen["gettempdir"] == str(tmpdir), seen
    # The run's key: a 32-byte file of this user's at 0600 in the 0700 state folder.
    assert (key["path"], key["mode"], key["uid"], key["size"]) == (
        str(state / "run.key"),
        0o600,
        os.geteuid(),
        32,
    )
    assert key["folder_mode"] == 0o700
    # NVRx's sockets in ft_launcher's private TMPDIR: inside the state folder where the path is
    # short enough, else a folder of its own in /tmp.
    sockets = Path(seen["socket"]["path"]).parent
    if case == "long TMPDIR":
        assert sockets.parent == Path("/tmp") and sockets.name.startswith(f"nvtrain-{run.pid}-"), seen
    else:
        assert sockets == state / "tmp", seen
    for sock in (seen["socket"], seen["rank_monitor"]):
        assert Path(sock["path"]).parent == sockets and sock["folder_mode"] == 0o700, seen
    # Gone with the run: no state folder, no torchelastic_* log folder, nothing else.
    assert list(tmpdir.iterdir()) == []
    assert not sockets.exists()
    assert list((tmp_path / "shm").iterdir()) == []

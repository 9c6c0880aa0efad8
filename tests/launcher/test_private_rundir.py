"""The run's folders on this node are this user's alone (``rundir.write_state``).

The state folder (``$TMPDIR``), ft_launcher's TMPDIR in it and the host-copy folder
(``[checkpoint] memory_dir``) are made at 0700, and one that exists is used only when it is this
user's, at 0700 and not a link; the run's folder on the checkpoint volume (shared by the pods)
must be this user's and not writable by group or others. Anything else is a usage error that
names the path, the key or variable, what is wrong and the fix; the refused folder is left as it
was, and the folders this start made are removed. Other users' folders need root to make; those
cases are in tests/launcher/test_private_folders.py.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvtrain.config.schema import Policy
from nvtrain.errors import UsageError
from nvtrain.launcher.identity import Identity
from nvtrain.launcher.rundir import RunPaths, prepare, remove_state, write_state
from nvtrain.nvrx import NvrxVersion

RUN_ID = "run-1"


@pytest.fixture
def base() -> Iterator[Path]:
    """A short folder (pytest's own are too long for ft_launcher's TMPDIR to be in the state
    folder: ``launcher_tmpdir``)."""
    path = Path(tempfile.mkdtemp(prefix="nvt-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _setup(base: Path, *, memory_dir: Path | None = None) -> tuple[Policy, RunPaths]:
    """The paths ``prepare`` gives a run whose TMPDIR is ``base/t``, memory_dir ``base/shm``
    and checkpoint dir ``base/ckpt``."""
    (base / "shm").mkdir()
    (base / "t").mkdir()
    policy = Policy.model_validate(
        {
            "job": {"name": "t", "script": "train.py"},
            "checkpoint": {"dir": str(base / "ckpt"), "memory_dir": str(memory_dir or base / "shm")},
        }
    )
    identity = Identity(
        node_rank=0,
        standalone=True,
        address=None,
        hostname="workstation",
        run_id=RUN_ID,
        has_gpu=False,
        has_infiniband=False,
    )
    saved = tempfile.tempdir
    tempfile.tempdir = str(base / "t")
    try:
        _, paths = prepare(policy, identity, nvrx=NvrxVersion.parse("0.4.1"))
    finally:
        tempfile.tempdir = saved
    assert paths.state_dir.parent == base / "t" and paths.run_dir == base / "ckpt" / RUN_ID
    assert paths.host_copy is not None and paths.host_copy.parent == Path(policy.checkpoint.memory_dir)
    return policy, paths


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _tree(path: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every entry under ``path`` (not following links): mode, owner, contents of files."""
    found = {}
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            entry = Path(root) / name
            info = os.lstat(entry)
            data = entry.read_bytes() if stat.S_ISREG(info.st_mode) else None
            found[str(entry.relative_to(path))] = (stat.S_IMODE(info.st_mode), info.st_uid, data)
    return found


@pytest.mark.parametrize("run_folder", [None, 0o700, 0o755], ids=["new", "0700", "0755"])
def test_the_folders_are_made_private_and_the_key_is_a_private_file(
    base: Path, run_folder: int | None
) -> None:
    """``run_folder``: the mode of a run folder another pod of the job (same user) made first,
    perhaps under an older nvtrain (0755): used as it is, and left to the job."""
    policy, paths = _setup(base)
    if run_folder is not None:
        paths.run_dir.mkdir(parents=True, mode=run_folder)
        paths.run_dir.chmod(run_folder)
        (paths.run_dir / "events-node1.jsonl").write_text("{}\n", encoding="utf-8")
    old = os.umask(0o000)  # the most permissive umask: the modes must not follow it
    try:
        write_state(policy, paths)
    finally:
        os.umask(old)
    launcher_tmp = paths.state_dir / "tmp"  # ft_launcher's TMPDIR: a short path here
    assert paths.host_copy is not None
    assert _mode(paths.run_dir) == (run_folder or 0o700)
    for folder in (paths.run_dir, paths.state_dir, launcher_tmp, paths.host_copy):
        assert os.lstat(folder).st_uid == os.geteuid(), folder
        assert folder == paths.run_dir or _mode(folder) == 0o700, folder
    key = os.lstat(paths.state_dir / "run.key")
    assert stat.S_ISREG(key.st_mode) and stat.S_IMODE(key.st_mode) == 0o600
    assert key.st_size == 32
    remove_state(paths)
    assert not paths.state_dir.exists() and not paths.host_copy.exists()
    if run_folder is not None:
        assert sorted(p.name for p in paths.run_dir.iterdir()) == ["events-node1.jsonl"]


def test_a_state_folder_of_this_users_from_an_earlier_launcher_is_used_again(base: Path) -> None:
    """A container restarted with the same pid and run id finds its own 0700 state folder,
    with a key in it: used, and the key replaced."""
    policy, paths = _setup(base)
    paths.state_dir.mkdir(mode=0o700)
    (paths.state_dir / "run.key").write_bytes(b"old")
    write_state(policy, paths)
    assert len((paths.state_dir / "run.key").read_bytes()) == 32
    remove_state(paths)


def _plant(path: Path, form: str, elsewhere: Path) -> None:
    if form == "open":
        path.mkdir()
        path.chmod(0o777)
        (path / "planted").write_bytes(b"not nvtrain's")
    elif form == "link":
        elsewhere.mkdir()
        (elsewhere / "planted").write_bytes(b"not nvtrain's")
        path.symlink_to(elsewhere, target_is_directory=True)
    else:
        raise AssertionError(form)


REASONS = {"open": "has mode 0777", "link": "is a symbolic link"}


@pytest.mark.parametrize("form", ["open", "link"])
@pytest.mark.parametrize("where", ["state", "launcher tmp", "host copy", "run folder"])
def test_a_folder_that_others_may_have_made_or_entered_is_refused_and_left_alone(
    base: Path, where: str, form: str
) -> None:
    policy, paths = _setup(base)
    elsewhere = base / "elsewhere"
    if where == "launcher tmp":
        paths.state_dir.mkdir(mode=0o700)  # an earlier launcher's, with a planted tmp in it
    target = {
        "state": paths.state_dir,
        "launcher tmp": paths.state_dir / "tmp",
        "host copy": paths.host_copy,
        "run folder": paths.run_dir,
    }[where]
    assert target is not None
    target.parent.mkdir(parents=True, exist_ok=True)
    _plant(target, form, elsewhere)
    before = {p: _tree(p) for p in (base / "t", base / "shm", base / "ckpt")}
    before_elsewhere = _tree(elsewhere) if elsewhere.exists() else None

    with pytest.raises(UsageError) as raised:
        write_state(policy, paths)
    message, fix = raised.value.message, raised.value.fix
    assert str(target) in message and REASONS[form] in message, message
    assert "remove" in fix and str(target) in fix, fix
    key = {
        "state": "$TMPDIR",
        "launcher tmp": "$TMPDIR",
        "host copy": "[checkpoint] memory_dir",
        "run folder": "[checkpoint] dir",
    }[where]
    assert key in message, message
    # Nothing of the planted folder used or removed, nothing else left.
    after = {p: _tree(p) for p in before}
    assert after == before
    if before_elsewhere is not None:
        assert _tree(elsewhere) == before_elsewhere


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_run_folder_that_group_or_others_may_write_is_refused(base: Path, mode: int) -> None:
    policy, paths = _setup(base)
    paths.run_dir.mkdir(parents=True)
    paths.run_dir.chmod(mode)
    with pytest.raises(UsageError, match=r"\[checkpoint\] dir") as raised:
        write_state(policy, paths)
    assert f"has mode {mode:04o}" in raised.value.message
    assert _mode(paths.run_dir) == mode
    assert list((base / "t").iterdir()) == [] and list((base / "shm").iterdir()) == []


def test_an_unusable_memory_dir_leaves_nothing(base: Path) -> None:
    """The start is refused at the host-copy folder, after the run's folder and the state folder
    were made: both are removed again."""
    policy, paths = _setup(base, memory_dir=base / "no-such-shm")
    with pytest.raises(UsageError, match=r"\[checkpoint\] memory_dir") as raised:
        write_state(policy, paths)
    assert "No such file or directory (ENOENT)" in raised.value.message
    assert list((base / "t").iterdir()) == []
    assert list((base / "ckpt").iterdir()) == []  # no run folder this start made


def test_a_refused_host_copy_folder_leaves_the_run_folder_another_pod_made(base: Path) -> None:
    policy, paths = _setup(base)
    paths.run_dir.mkdir(parents=True, mode=0o700)
    assert paths.host_copy is not None
    _plant(paths.host_copy, "open", base / "elsewhere")
    with pytest.raises(UsageError, match=r"\[checkpoint\] memory_dir"):
        write_state(policy, paths)
    assert paths.run_dir.is_dir()  # not this start's: kept
    assert list((base / "t").iterdir()) == []

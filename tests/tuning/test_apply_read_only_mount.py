"""``tune-interval --apply`` where the policy cannot be written, each cause told as it is: a real
read-only mount (a tmpfs remounted ``ro``: ``EROFS``, which no mode would change, so the message
must not blame the file's mode), and a folder the user may not write (``EACCES``, as the user
nobody through ``setpriv``: the file is replaced by a rename in its folder). Both need root
(mounting, acting as another user) and are skipped, saying so, without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nvtrain.cli import app
from support.otheruser import skip_unless_nobody_can_import

NOBODY = 65534
TIMINGS = ["--step-time", "1s", "--save-block", "1s", "--save-write", "10s", "--mtbf", "8h"]
POLICY = '[job]\nname = "llm"\nscript = "train.py"\n\n[checkpoint]\ninterval = 1000\n'


def _needs_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"{what} needs root")


@pytest.fixture
def read_only_mount() -> Iterator[Path]:
    """A tmpfs holding ``p.toml``, remounted read-only; unmounted and removed afterwards."""
    _needs_root("mounting a read-only file system")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("needs mount and umount (util-linux)")
    folder = Path(tempfile.mkdtemp(prefix="nvt-ro-", dir="/tmp"))
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True
    )
    if made.returncode != 0:
        folder.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode(errors='replace').strip()}")
    try:
        (folder / "p.toml").write_text(POLICY, encoding="utf-8")
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False, capture_output=True)
        if not os.path.ismount(folder):
            folder.rmdir()


def test_apply_on_a_read_only_mount_says_the_mount_is_read_only(read_only_mount: Path) -> None:
    path = read_only_mount / "p.toml"
    result = CliRunner().invoke(app, ["tune-interval", *TIMINGS, "--apply", str(path)])
    said = " ".join(result.stderr.split())
    assert result.exit_code == 2, result.output
    assert (
        f"nvtrain: error: --apply: {path} is on a file system mounted read-only at {read_only_mount}, so "
        "its interval is left as it is" in said
    ), result.stderr
    assert f"remount {read_only_mount} read-write (mount -o remount,rw {read_only_mount})" in said
    assert f"cp {path} policy.toml" in said, result.stderr
    assert "mode" not in said.replace("no file mode or owner", "") and "chmod" not in said, result.stderr
    assert path.read_text(encoding="utf-8") == POLICY


@pytest.fixture
def folder_of_roots() -> Iterator[Path]:
    """A folder of root's (0755) that every user may enter, holding ``p.toml`` owned by nobody."""
    _needs_root("acting as the user nobody")
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to act as another user")
    folder = Path(tempfile.mkdtemp(prefix="nvt-acc-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        (folder / "p.toml").write_text(POLICY, encoding="utf-8")
        os.chown(folder / "p.toml", NOBODY, NOBODY)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_apply_without_permission_on_the_folder_says_so(folder_of_roots: Path) -> None:
    skip_unless_nobody_can_import("nvtrain.cli")
    path = folder_of_roots / "p.toml"
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable]
    argv += ["-m", "nvtrain", "tune-interval", *TIMINGS, "--apply", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=folder_of_roots)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert (
        f"--apply: cannot write {path}: no permission to write in {folder_of_roots} (Permission denied)"
        in said
    ), done.stderr
    assert f"chmod u+w {folder_of_roots}" in said and "read-only" not in said, done.stderr
    assert path.read_text(encoding="utf-8") == POLICY
    assert sorted(p.name for p in folder_of_roots.iterdir()) == ["p.toml"]  # no new file left


def test_apply_on_a_read_only_bind_mount_says_the_mount_is_read_only(tmp_path: Path) -> None:
    # A read-only bind mount (as a container's read-only volume is), made in a mount namespace
    # of the command's own (unshare -m), so that nothing outside it sees the mount.
    _needs_root("a bind mount in a mount namespace of its own")
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare and mount (util-linux)")
    source, view = tmp_path / "source", tmp_path / "view"
    source.mkdir()
    view.mkdir()
    (source / "p.toml").write_text(POLICY, encoding="utf-8")
    path = view / "p.toml"
    apply = [sys.executable, "-m", "nvtrain", "tune-interval", *TIMINGS, "--apply", str(path)]
    script = f'mount --bind "{source}" "{view}" && mount -o remount,bind,ro "{view}" && exec "$@"'
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *apply]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    if done.returncode != 2 and "nvtrain: " not in done.stderr:
        pytest.skip(f"cannot make a read-only bind mount here: {done.stderr.strip()}")
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert (
        f"--apply: {path} is on a file system mounted read-only at {view}, so its interval is left "
        "as it is" in said
    ), done.stderr
    assert "mode" not in said.replace("no file mode or owner", "") and "chmod" not in said, done.stderr
    assert (source / "p.toml").read_text(encoding="utf-8") == POLICY
    assert not os.path.ismount(view)  # the mount stayed inside the command's namespace

"""``nvtrain.private``: folders and files that only this user can have made or entered, with
real files, modes and owners (another user's folders are made by chown, as root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nvtrain import private

NOBODY = 65534


def test_a_new_folder_is_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o777)
    try:
        assert private.make_private_dir(tmp_path / "a") is True
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o7777 == 0o700
    assert private.make_private_dir(tmp_path / "a") is False  # ours, private: used again
    with pytest.raises(private.NotPrivate, match="exists already"):
        private.make_private_dir(tmp_path / "a", exist_ok=False)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: (p.mkdir(), p.chmod(0o755)), "has mode 0755"),
        (
            lambda p: (p.parent.joinpath("real").mkdir(mode=0o700), p.symlink_to(p.parent / "real")),
            "symbolic link",
        ),
        (lambda p: p.write_text("x"), "is not a folder"),
        (lambda p: (p.mkdir(mode=0o700), os.chown(p, NOBODY, NOBODY)), "belongs to uid 65534"),
    ],
    ids=["open", "link", "file", "nobody's"],
)
def test_what_is_there_first_is_refused_and_left_as_it_is(tmp_path: Path, make: object, reason: str) -> None:
    if "nobody" in reason and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    path = tmp_path / "taken"
    make(path)  # type: ignore[operator]
    before = os.lstat(path)
    with pytest.raises(private.NotPrivate, match=reason) as caught:
        private.make_private_dir(path)
    assert caught.value.path == path and not caught.value.parent
    after = os.lstat(path)
    assert (after.st_mode, after.st_uid, after.st_ino) == (before.st_mode, before.st_uid, before.st_ino)


def test_a_parent_anyone_may_write_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)
    with pytest.raises(private.NotPrivate, match="anyone may write without the sticky bit") as caught:
        private.make_private_dir(parent / "run")
    assert caught.value.parent and not (parent / "run").exists()
    parent.chmod(0o1777)  # /tmp and /dev/shm: the sticky bit keeps others from renaming ours
    assert private.make_private_dir(parent / "run") is True
    group = tmp_path / "volume"  # a Kubernetes volume with fsGroup: group-writable, setgid
    group.mkdir()
    group.chmod(0o2775)
    assert private.make_private_dir(group / "run") is True


def test_a_private_file_is_0600_never_follows_a_link_and_is_read_back_only_when_private(
    tmp_path: Path,
) -> None:
    key = private.write_run_key(tmp_path / "run.key")
    assert (tmp_path / "run.key").stat().st_mode & 0o777 == 0o600
    assert private.run_key({private.RUN_KEY_ENV: str(tmp_path / "run.key")}) == key
    assert private.run_key({}) is None
    with pytest.raises(FileExistsError):
        private.write_run_key(tmp_path / "run.key")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):  # O_EXCL | O_NOFOLLOW: the link's target is not made
        private.write_private_file(tmp_path / "link", b"secret")
    assert not (tmp_path / "elsewhere").exists()
    (tmp_path / "run.key").chmod(0o640)
    with pytest.raises(private.NotPrivate, match="has mode 0640"):
        private.run_key({private.RUN_KEY_ENV: str(tmp_path / "run.key")})
    (tmp_path / "short").write_bytes(b"x" * 8)
    (tmp_path / "short").chmod(0o600)
    with pytest.raises(private.NotPrivate, match="holds 8 bytes"):
        private.run_key({private.RUN_KEY_ENV: str(tmp_path / "short")})
    (tmp_path / "to-key").symlink_to(tmp_path / "short")
    with pytest.raises(private.NotPrivate, match="symbolic link"):
        private.read_private_file(tmp_path / "to-key")
